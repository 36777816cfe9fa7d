"""``trimtab run``: start a whole job and supervise it.

The launcher starts the coordinator, the servers and one process per worker running the
user's command, streams their output with a prefix, and exits with the workers' status.
Where each role runs is its backend's business (:mod:`trimtab.launch.backends`: this
machine, a test bed's hosts, a Ray cluster, a Slurm allocation); what follows is the
same for all of them.
A crashed worker or server, or Ctrl-C, ends the whole job: every process it started is
stopped (its process group terminated, then killed), and none is left behind. A process
that ``--fault`` killed is the exception (:mod:`trimtab.launch.faults`): the launcher
says so and goes on, and the job's own handling of the death decides what follows.

Every job has a secret (:mod:`trimtab.transport.auth`): 32 random bytes in a file of mode
0600 in a private 0700 directory, made before anything starts and removed at the end;
each process of the job gets its path as ``TRIMTAB_SECRET_FILE`` (never the secret).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trimtab.errors import ConfigError
from trimtab.faults.kills import parse_faults
from trimtab.frontend.compression import compressor
from trimtab.launch import env as envvars
from trimtab.launch.backends import HOST, Backend, RoleHandle, RoleSpec, backend_for
from trimtab.launch.coordinator import coordinator_argv
from trimtab.launch.cores import available_cores
from trimtab.launch.faults import FaultWatch
from trimtab.launch.hosts import Layout
from trimtab.launch.procs import Proc as _Proc
from trimtab.launch.procs import (
    print_prefixed,
    stop_all,
)
from trimtab.launch.resume import resolved
from trimtab.launch.spec import LaunchConfig
from trimtab.launch.supervise import DEADLINE_STATUS, Supervision
from trimtab.launch.testbed import Testbed
from trimtab.observe.records import record_launch
from trimtab.observe.timeline import merged, prepare
from trimtab.settings import CheckpointSettings
from trimtab.transport.auth import JobKey, make_secret_file, read_secret_file
from trimtab.transport.shm import remove_job_arenas, remove_stale_arenas
from trimtab.transport.spin import SPIN_DEFAULT_US, parse_spin

__all__ = ["DEADLINE_STATUS", "Job", "LaunchConfig", "OutputHandler", "print_prefixed"]

#: Called with (source, line) for every line a process prints, e.g. ("worker 0", "...").
OutputHandler = Callable[[str, str], None]


class Job(Supervision):
    """One local job. :meth:`run` blocks until it is over and returns the exit status."""

    def __init__(
        self,
        config: LaunchConfig,
        command: Sequence[str],
        output: OutputHandler = print_prefixed,
        extra_env: dict[str, str] | None = None,
        testbed: Testbed | None = None,
        layout: Layout | None = None,
        backend: Backend | None = None,
    ) -> None:
        """``backend``: where the roles run (default: as ``config`` says, see
        :func:`~trimtab.launch.backends.backend_for`). ``testbed``: a bed that is up, to
        run the roles on, where ``layout`` says (default:
        :func:`~trimtab.launch.hosts.place`'s rule); without one, ``config.testbed``
        hosts make a bed of the job's own, removed at its end. Raises
        :class:`ConfigError` for a backend that is not installed."""
        if not command:
            raise ConfigError("nothing to run: give the worker command after `--`")
        if config.observe.trace:  # absolute: every role writes there, wherever it runs
            observe = dataclasses.replace(config.observe, trace=str(prepare(config.observe.trace)))
            config = dataclasses.replace(config, observe=observe)
        self.config = config
        self.command = list(command)
        self.output = output
        self.extra_env = extra_env or {}
        self._procs: list[_Proc] = []
        self._servers_started = 0
        # The worker ranks the coordinator counted as members, as its STATUS said them
        # (an elastic job's supervisor polls it): joiners it never counted stop early.
        self._members: set[int] = set()
        self.coordinator_address = ""
        #: Coordinators that replaced a dead one so far.
        self.coordinator_failovers = 0
        self._checkpoint = CheckpointSettings()  # as passed on (resolved at the start)
        self._started = 0.0
        self._secret_dir: Path | None = None
        self._server_key = ""  # hex, made for a job without authentication
        self._key: JobKey | None = None
        self.backend = backend or backend_for(config, testbed, layout)
        #: The deaths ``--fault`` caused, and the joins still to start.
        self.faults = FaultWatch(parse_faults(config.faults))

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
            self.backend.up()
            where = self.backend.where()
            if where is not None:
                self._say(f"job {self.config.job} {where}")
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
            if self.config.observe.trace:  # every process wrote its own: one file of all
                self._say(merged(self.config.observe.trace))
            self.backend.down()
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
        parent = self.backend.secret_parent()
        self._secret_dir = Path(tempfile.mkdtemp(prefix="trimtab-secret-", dir=parent))
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
        if self.config.observe.trace:
            env[envvars.TRACE] = self.config.observe.trace
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

    @property
    def layout(self) -> Layout:
        """Where a test bed's roles run (an empty layout for other backends)."""
        return getattr(self.backend, "layout", Layout())

    def _spawn(
        self, kind: str, index: int, argv: list[str], env: dict[str, str], late: bool = False
    ) -> _Proc:
        role = RoleSpec(kind, index, argv, env, late)
        handle = self.backend.start(role)
        reader = threading.Thread(target=self._pump, args=(role.source, handle), daemon=True)
        reader.start()
        proc = _Proc(role.source, handle, reader)
        self._procs.append(proc)
        return proc

    def _pump(self, source: str, handle: RoleHandle) -> None:
        # Where the backend placed it, if it chose (a Ray node): known once it started,
        # which this thread waits for, not the launcher's.
        if (node := handle.node()) is not None:
            self._say(f"{source} runs on {node}")
        for raw in handle.lines():
            line = raw.decode(errors="replace").rstrip("\n")
            self.faults.saw(source, line)
            self.output(source, line)

    def _start(self) -> None:
        c = self.config
        env = self._role_env()
        self._checkpoint = resolved(c.checkpoint, c.chunk_bytes, self._say)
        record_launch(c.observe.runs_dir, c.job, c, self.command)  # the coordinator adds its own
        with tempfile.TemporaryDirectory(prefix="trimtab-") as tmp:
            address_file = Path(tmp) / "coordinator"
            argv = [
                *coordinator_argv(c, HOST, self._checkpoint),
                "--address-file",
                str(address_file),
            ]
            coord = self._spawn("coordinator", 0, argv, env)
            deadline = time.monotonic() + c.startup_timeout_s
            while not address_file.exists():
                if (code := coord.handle.poll()) is not None:
                    raise ConfigError(
                        f"the coordinator exited with status {code} "
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
        if c.checkpoint != CheckpointSettings():
            self._say(
                f"job {c.job}: a checkpoint now: trimtab checkpoint --coordinator "
                f"{self.coordinator_address} --job {c.job}"
                + (f" --secret-file {self._secret_dir / 'secret'}" if self._secret_dir else "")
            )
        for rank in range(c.workers):
            self._spawn_worker(rank)

    def _spawn_worker(self, rank: int) -> None:
        """Start worker ``rank`` (one joining a running job takes the next rank the
        coordinator gives; ``rank`` then only names its output)."""
        c = self.config
        host, port = self.coordinator_address.removeprefix("tcp://").rsplit(":", 1)
        threads = max(1, (os.cpu_count() or 1) // c.workers)
        local_rank, local_size, cross_rank, cross_size = self.backend.local(rank, c.workers)
        wenv = self._role_env()
        wenv.setdefault("OMP_NUM_THREADS", str(threads))
        wenv.update(
            {
                envvars.COORDINATOR: self.coordinator_address,
                envvars.JOB: c.job,
                envvars.RANK: str(rank),
                envvars.LOCAL_RANK: str(local_rank),
                envvars.LOCAL_SIZE: str(local_size),
                envvars.CROSS_RANK: str(cross_rank),
                envvars.CROSS_SIZE: str(cross_size),
                envvars.NUM_WORKERS: str(c.workers),
                envvars.NUM_SERVERS: str(c.servers),
                envvars.STRAGGLERS: ";".join(c.stragglers),
                envvars.FAULTS: ";".join(c.faults),
                envvars.COMPRESSION: compressor(c.compression).name,
                envvars.DMLC_ROLE: "worker",
                envvars.DMLC_PS_ROOT_URI: host,
                envvars.DMLC_PS_ROOT_PORT: port,
                envvars.DMLC_NUM_WORKER: str(c.workers),
                envvars.DMLC_NUM_SERVER: str(c.servers),
                envvars.DMLC_WORKER_ID: str(rank),
            }
        )
        self._spawn("worker", rank, self.command, wenv, late=rank >= c.workers)

    def _spawn_server(self) -> None:
        c = self.config
        env = self._role_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        env[envvars.STRAGGLERS] = ";".join(c.stragglers)
        env[envvars.FAULTS] = ";".join(c.faults)
        index = self._servers_started  # (a lost one's number is never given again)
        self._servers_started += 1
        self._spawn(
            "server",
            index,
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
                HOST,
                *(["--verbose"] if c.verbose else []),
            ],
            env,
            late=index >= c.servers,  # (the job's first servers are 0 to servers - 1)
        )

    def _stop_all(self) -> None:
        stop_all(self._procs)
        remove_job_arenas(self.config.job)  # what a killed worker could not remove

    def _say(self, message: str) -> None:
        self.output("trimtab", message)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, stopping the launcher as Ctrl-C does (but its status is 143)."""


def _raise_interrupt(signum: int, frame: object) -> None:
    raise _Terminated
