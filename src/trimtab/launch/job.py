"""``trimtab run``: start a whole job on this machine and supervise it.

The launcher starts the coordinator, the servers and one process per worker running the
user's command, streams their output with a prefix, and exits with the workers' status.
A crashed worker or server, or Ctrl-C, ends the whole job: every process it started is
stopped (its process group terminated, then killed), and none is left behind.

Every job has a secret (:mod:`trimtab.transport.auth`): 32 random bytes in a file of mode
0600 in a private 0700 directory, made before anything starts and removed at the end;
each process of the job gets its path as ``TRIMTAB_SECRET_FILE`` (never the secret).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trimtab.errors import ConfigError, NodeTimeout
from trimtab.frontend.compression import compressor
from trimtab.launch import env as envvars
from trimtab.launch.control import ask_coordinator
from trimtab.launch.cores import available_cores
from trimtab.launch.spec import LaunchConfig, to_argv
from trimtab.protocol import headers
from trimtab.runtime.diagnostics import STACK_SIGNAL
from trimtab.transport.auth import JobKey, make_secret_file, read_secret_file
from trimtab.transport.shm import remove_job_arenas, remove_stale_arenas
from trimtab.transport.spin import SPIN_DEFAULT_US, parse_spin

__all__ = ["DEADLINE_STATUS", "Job", "LaunchConfig", "OutputHandler", "print_prefixed"]

#: Called with (source, line) for every line a process prints, e.g. ("worker 0", "...").
OutputHandler = Callable[[str, str], None]

#: :meth:`Job.run`'s status for a job stopped at its deadline (as ``timeout(1)``'s).
DEADLINE_STATUS = 124


def print_prefixed(source: str, line: str) -> None:
    """The default output handler: ``[worker 0] line`` on stdout."""
    sys.stdout.write(f"[{source}] {line}\n")
    sys.stdout.flush()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # If the launcher is killed outright, the kernel stops its children too (Linux).
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclasses.dataclass
class _Proc:
    source: str
    popen: subprocess.Popen[bytes]
    reader: threading.Thread


class Job:
    """One local job. :meth:`run` blocks until it is over and returns the exit status."""

    def __init__(
        self,
        config: LaunchConfig,
        command: Sequence[str],
        output: OutputHandler = print_prefixed,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        if not command:
            raise ConfigError("nothing to run: give the worker command after `--`")
        self.config = config
        self.command = list(command)
        self.output = output
        self.extra_env = extra_env or {}
        self._procs: list[_Proc] = []
        self.coordinator_address = ""
        self._started = 0.0
        self._secret_dir: Path | None = None
        self._server_key = ""  # hex, made for a job without authentication
        self._key: JobKey | None = None

    def run(self) -> int:
        """Start everything, supervise, tear down. Blocks. Returns the job's exit status
        (the first failing worker's, 1 for a failed server, 130 on Ctrl-C, 143 on
        SIGTERM,
        :data:`DEADLINE_STATUS` past ``config.deadline_s``)."""
        self._started = time.monotonic()
        previous = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            remove_stale_arenas()  # what jobs killed outright (SIGKILL) left behind
            self._make_secret()
            self._start()
            return self._supervise()
        except KeyboardInterrupt as exc:
            term = isinstance(exc, _Terminated)
            self._say(
                f"{'terminated' if term else 'interrupted'}; stopping every process of the job"
            )
            return 128 + (signal.SIGTERM if term else signal.SIGINT)  # as the shell says
        except ConfigError as exc:
            self._say(str(exc))
            return 2
        finally:
            self._stop_all()
            if self._secret_dir is not None:
                shutil.rmtree(self._secret_dir, ignore_errors=True)
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)

    # -- start -----------------------------------------------------------------------

    def _make_secret(self) -> None:
        """The job's secret file, in a private directory (``mkdtemp`` makes it 0700)."""
        if self.config.no_auth:
            # No secret to derive the server key from: the launcher makes one, so that
            # servers it adds later can still join (an insecure job, as said).
            self._server_key = secrets.token_hex(32)
            return
        self._secret_dir = Path(tempfile.mkdtemp(prefix="trimtab-secret-"))
        path = make_secret_file(self._secret_dir)
        self._key = JobKey(read_secret_file(path), encrypt=self.config.encrypt)

    def _role_env(self) -> dict[str, str]:
        """The environment of a process of the job. Raises :class:`ConfigError` for a
        bad ``TRIMTAB_SPIN_US``."""
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        for name in (envvars.SECRET_FILE, envvars.AUTH, envvars.ENCRYPT):
            env.pop(name, None)  # the job's own, never the caller's
        if self._secret_dir is None:
            env[envvars.AUTH] = "0"
            if self._server_key:
                env.setdefault(envvars.SERVER_KEY, self._server_key)
        else:
            env[envvars.SECRET_FILE] = str(self._secret_dir / "secret")
            env[envvars.ENCRYPT] = "1" if self.config.encrypt else "0"
        if envvars.SPIN_US in env:
            parse_spin(env[envvars.SPIN_US])  # the user's: checked before anything starts
        else:
            env[envvars.SPIN_US] = str(SPIN_DEFAULT_US if self._fits_cores() else 0)
        return env

    def _fits_cores(self) -> bool:
        """Whether every worker and server this job may start has a core of its own, so
        that one polling for its next message (``TRIMTAB_SPIN_US``) takes no core
        another needs: on 2 cores, 1 worker and 1 server do, 2 and 2 do not. Where
        processes take turns on a core, a polling one delays the one with work (as
        MPI's busy waiting, which yields on an oversubscribed machine); the 2 x 2
        100 MiB job of ``trimtab bench datapath`` measured the same step either way
        here (its waits are long), so this errs on the side of the shared machine."""
        c = self.config
        return c.workers + c.settings.max_servers <= available_cores()

    def _spawn(self, source: str, argv: list[str], env: dict[str, str]) -> _Proc:
        popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        reader = threading.Thread(target=self._pump, args=(source, popen), daemon=True)
        reader.start()
        proc = _Proc(source, popen, reader)
        self._procs.append(proc)
        return proc

    def _pump(self, source: str, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        for raw in iter(popen.stdout.readline, b""):
            self.output(source, raw.decode(errors="replace").rstrip("\n"))

    def _start(self) -> None:
        c = self.config
        role = [sys.executable, "-m", "trimtab"]
        env = self._role_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        log_flags = ["--verbose"] if c.verbose else []
        with tempfile.TemporaryDirectory(prefix="trimtab-") as tmp:
            address_file = Path(tmp) / "coordinator"
            coord = self._spawn(
                "coordinator",
                [
                    *role,
                    "coordinator",
                    "--workers",
                    str(c.workers),
                    "--servers",
                    str(c.servers),
                    *to_argv(c.settings.placement),
                    *to_argv(c.settings.consistency),
                    *to_argv(c.settings.batching),
                    *to_argv(c.settings.elastic),
                    "--job",
                    c.job,
                    "--host",
                    c.host,
                    "--address-file",
                    str(address_file),
                    *log_flags,
                ],
                env,
            )
            deadline = time.monotonic() + c.startup_timeout_s
            while not address_file.exists():
                if coord.popen.poll() is not None:
                    raise ConfigError(
                        f"the coordinator exited with status {coord.popen.returncode} "
                        "before it was ready (its output is above)"
                    )
                if time.monotonic() > deadline:
                    raise ConfigError(f"the coordinator was not ready in {c.startup_timeout_s}s")
                time.sleep(0.02)
            self.coordinator_address = address_file.read_text().strip()
        for _ in range(c.servers):
            self._spawn_server()
        if c.max_servers > c.servers:
            self._say(
                f"job {c.job}, coordinator {self.coordinator_address}; up to "
                f"{c.max_servers} servers: trimtab scale --coordinator "
                f"{self.coordinator_address} --job {c.job} --servers K"
                + (f" --secret-file {self._secret_dir / 'secret'}" if self._secret_dir else "")
            )
        host, port = self.coordinator_address.removeprefix("tcp://").rsplit(":", 1)
        threads = max(1, (os.cpu_count() or 1) // c.workers)
        for rank in range(c.workers):
            wenv = self._role_env()
            wenv.setdefault("OMP_NUM_THREADS", str(threads))
            wenv.update(
                {
                    envvars.COORDINATOR: self.coordinator_address,
                    envvars.JOB: c.job,
                    envvars.RANK: str(rank),
                    envvars.LOCAL_RANK: str(rank),
                    envvars.LOCAL_SIZE: str(c.workers),
                    envvars.NUM_WORKERS: str(c.workers),
                    envvars.NUM_SERVERS: str(c.servers),
                    envvars.STRAGGLERS: ";".join(c.stragglers),
                    envvars.COMPRESSION: compressor(c.compression).name,
                    envvars.DMLC_ROLE: "worker",
                    envvars.DMLC_PS_ROOT_URI: host,
                    envvars.DMLC_PS_ROOT_PORT: port,
                    envvars.DMLC_NUM_WORKER: str(c.workers),
                    envvars.DMLC_NUM_SERVER: str(c.servers),
                    envvars.DMLC_WORKER_ID: str(rank),
                }
            )
            self._spawn(f"worker {rank}", self.command, wenv)

    def _spawn_server(self) -> None:
        c = self.config
        env = self._role_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        env[envvars.STRAGGLERS] = ";".join(c.stragglers)
        index = sum(p.source.startswith("server") for p in self._procs)
        self._spawn(
            f"server {index}",
            [
                sys.executable,
                "-m",
                "trimtab",
                "server",
                "--coordinator",
                self.coordinator_address,
                "--job",
                c.job,
                "--host",
                c.host,
                *(["--verbose"] if c.verbose else []),
            ],
            env,
        )

    def _grow(self) -> None:
        """Start the servers the coordinator asks for (psld's scale-out, trimtab scale)."""
        try:
            reply = ask_coordinator(
                self.coordinator_address,
                self.config.job,
                headers.status_request(),
                2.0,
                self._key,
            )
        except NodeTimeout:
            return  # busy or ending: the supervisor notices a dead coordinator anyway
        servers = [p for p in self._procs if p.source.startswith("server")]
        started = len(servers)
        # The coordinator keeps its active servers within max_servers; this bounds the
        # live processes too, in case a retired one has not exited yet.
        room = self.config.max_servers - sum(p.popen.poll() is None for p in servers)
        wanted = headers.read_status_reply(reply)["wanted_servers"]
        for _ in range(min(wanted - started, room)):
            self._say(f"the coordinator asks for another server: starting server {started}")
            self._spawn_server()
            started += 1

    # -- supervise -------------------------------------------------------------------

    def _supervise(self) -> int:
        workers = [p for p in self._procs if p.source.startswith("worker")]
        elastic = self.config.max_servers > self.config.servers
        next_poll = time.monotonic()
        deadline = self._started + self.config.deadline_s if self.config.deadline_s else None
        while True:
            others = [p for p in self._procs if not p.source.startswith("worker")]
            if deadline is not None and time.monotonic() >= deadline:
                self._dump_stacks()
                return DEADLINE_STATUS
            if elastic and time.monotonic() >= next_poll:
                self._grow()
                next_poll = time.monotonic() + 0.5
            for p in workers:
                code = p.popen.poll()
                if code is not None and code != 0:
                    self._say(f"{p.source} exited with status {_describe(code)}; stopping the job")
                    return code if code > 0 else 128 - code
            if all(p.popen.poll() is not None for p in workers):
                self._await_exit(others)
                return 0
            for p in others:
                code = p.popen.poll()
                # Status 0 is a normal end: the coordinator and servers exit once every
                # worker said it is done, which can be before the worker processes exit.
                if code is not None and code != 0:
                    self._say(
                        f"{p.source} exited with status {_describe(code)} while "
                        "workers were running; stopping the job"
                    )
                    return 1
            time.sleep(0.05)

    def _dump_stacks(self) -> None:
        """Ask every live process for its threads' stacks (they print them and go on)."""
        self._say(
            f"the job ran past its deadline ({self.config.deadline_s:g} s): every process "
            "prints its threads' stacks, then the job stops"
        )
        for p in self._procs:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.popen.pid, STACK_SIGNAL)
        time.sleep(1.0)  # the stacks reach the output through the readers

    def _await_exit(self, procs: list[_Proc]) -> None:
        deadline = time.monotonic() + self.config.grace_s
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in procs):
            time.sleep(0.05)

    def _stop_all(self) -> None:
        live = [p for p in self._procs if p.popen.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in live):
            time.sleep(0.05)
        for p in self._procs:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()
            # Kill anything the process left in its group (e.g. a data loader worker).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.popen.pid, signal.SIGKILL)
        for p in self._procs:
            p.reader.join(timeout=2.0)
        remove_job_arenas(self.config.job)  # what a killed worker could not remove

    def _say(self, message: str) -> None:
        self.output("trimtab", message)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, stopping the launcher as Ctrl-C does (but its status is 143)."""


def _raise_interrupt(signum: int, frame: object) -> None:
    raise _Terminated
