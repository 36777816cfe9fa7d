"""How ``trimtab run`` supervises a started job, as a part of
:class:`~trimtab.launch.job.Job` (a mixin: the launcher's module keeps starting and
tearing down): it watches every process, replaces a dead coordinator, starts the
servers and workers the coordinator asks for and the joins ``--fault`` schedules, says
which deaths were injected, and decides the job's exit status. Runs on the launcher's
thread; its loop blocks until the job is over."""

from __future__ import annotations

import time

from trimtab.launch.backends import HOST, Backend
from trimtab.launch.control import job_status
from trimtab.launch.coordinator import replacement_argv
from trimtab.launch.faults import FaultWatch
from trimtab.launch.procs import Proc as _Proc
from trimtab.launch.procs import (
    await_end,
    dump_stacks,
    end_status,
    job_over,
    late_joiners,
    stop_late,
)
from trimtab.launch.procs import describe as _describe
from trimtab.launch.spec import LaunchConfig
from trimtab.protocol import headers
from trimtab.protocol.messages import Header
from trimtab.settings import CheckpointSettings
from trimtab.transport.auth import JobKey

__all__ = ["DEADLINE_STATUS", "Supervision"]

#: :meth:`Job.run`'s status for a job stopped at its deadline (as ``timeout(1)``'s).
DEADLINE_STATUS = 124


class Supervision:
    """The supervising half of a :class:`~trimtab.launch.job.Job` (see the module)."""

    config: LaunchConfig
    backend: Backend
    faults: FaultWatch
    coordinator_address: str
    coordinator_failovers: int
    _procs: list[_Proc]
    _members: set[int]
    _servers_started: int
    _started: float
    _checkpoint: CheckpointSettings
    _key: JobKey | None

    def _spawn(
        self, kind: str, index: int, argv: list[str], env: dict[str, str], late: bool = False
    ) -> _Proc:
        raise NotImplementedError

    def _spawn_worker(self, rank: int) -> None:
        raise NotImplementedError

    def _spawn_server(self) -> None:
        raise NotImplementedError

    def _role_env(self) -> dict[str, str]:
        raise NotImplementedError

    def _say(self, message: str) -> None:
        raise NotImplementedError

    def _status(self) -> Header | None:
        """The coordinator's STATUS reply, or None if it did not answer within 2 s (busy
        or ending: the supervisor notices a dead coordinator anyway). Blocks."""
        where = self.backend.near_coordinator()
        return job_status(self.coordinator_address, self.config.job, self._key, where)

    def _grow(self) -> None:
        """Start the servers and workers the coordinator asks for (psld's scale-out,
        trimtab scale)."""
        reply = self._status()
        if reply is None:
            return
        status = headers.read_status_reply(reply)
        self._members.update(r for r in status["workers"] if isinstance(r, int))
        workers = sum(p.source.startswith("worker") for p in self._procs)
        for rank in range(workers, int(reply.get("wanted_workers", 0))):
            self._say(f"the coordinator asks for another worker: starting worker {rank}")
            self._spawn_worker(rank)
        servers = [p for p in self._procs if p.source.startswith("server")]
        # The coordinator keeps its active servers within max_servers; this bounds the
        # live processes too, in case a retired (or lost) one has not exited yet. Its
        # count of servers wanted includes the lost ones, as this one does.
        room = self.config.settings.max_servers - sum(p.handle.poll() is None for p in servers)
        for _ in range(min(status["wanted_servers"] - self._servers_started, room)):
            self._say(
                f"the coordinator asks for another server: starting server {self._servers_started}"
            )
            self._spawn_server()

    def _supervise(self) -> int:
        c = self.config
        # An elastic job goes on without a lost worker (the coordinator decides whether
        # enough remain) and may be asked for more.
        lossy = c.settings.elastic_workers
        # With replicas, a lost server is replaced (its chunks' backups need a server).
        elastic = c.max_servers > c.servers or c.settings.max_workers > c.workers or c.replicas
        next_poll = next_join = time.monotonic()
        deadline = self._started + self.config.deadline_s if self.config.deadline_s else None
        lost: set[str] = set()
        ended = 0.0  # when the coordinator exited 0: the job is over
        while True:
            workers = [p for p in self._procs if p.source.startswith("worker")]
            others = [p for p in self._procs if not p.source.startswith("worker")]
            if not ended and any(job_over(p) for p in others):
                ended = time.monotonic()
            for p in others:  # first: nobody answers the status requests below meanwhile
                code = p.handle.poll()
                if code is not None and code < 0 and p.source == "coordinator" and not ended:
                    self._injected(p, code)  # (says so, if --fault killed it)
                    self._replace_coordinator(p, code, workers)
            others = [p for p in self._procs if not p.source.startswith("worker")]
            if ended:  # joiners that came too late
                late = late_joiners(
                    workers, c.workers, self._members, time.monotonic() - ended, c.grace_s
                )
                lost.update(p.source for p in stop_late(late, self._say))
            if deadline is not None and time.monotonic() >= deadline:
                self._say(
                    f"the job ran past its deadline ({c.deadline_s:g} s): every process "
                    "prints its threads' stacks, then the job stops"
                )
                dump_stacks(self._procs)
                return DEADLINE_STATUS
            # Once the coordinator has ended the job there is nobody to ask.
            if elastic and not ended and time.monotonic() >= next_poll:
                self._grow()
                next_poll = time.monotonic() + 0.5
            if self.faults.joins_pending and not ended and time.monotonic() >= next_join:
                self._join_workers()
                next_join = time.monotonic() + 0.2
            for p in workers:
                code = p.handle.poll()
                if code is not None and code != 0 and p.source not in lost:
                    if self._injected(p, code):
                        lost.add(p.source)  # killed by --fault: the job decides what follows
                        continue
                    if not lossy:
                        self._say(
                            f"{p.source} exited with status {_describe(code)}; stopping the job"
                        )
                        return code if code > 0 else 128 - code
                    lost.add(p.source)
                    self._say(f"{p.source} exited with status {_describe(code)}; the job goes on")
            if all(p.handle.poll() is not None for p in workers):
                await_end(others, self.config.grace_s, self._say)
                return end_status(others, bool(lost))
            for p in others:
                code = p.handle.poll()
                if code is not None and code < 0 and p.source == "coordinator" and not ended:
                    continue  # killed since this pass began: replaced at the next one's top
                if code is not None and code != 0 and self._injected(p, code):
                    self._procs.remove(p)  # killed by --fault (said once): the job decides
                    continue
                # A server, in a job with replicas: its coordinator promotes the backups
                # (or ends the job if it cannot).
                if code and c.replicas > 0 and p.source.startswith("server"):
                    self._say(f"{p.source} died ({_describe(code)}); its backups take over")
                    self._procs.remove(p)
                    continue
                # Status 0 is a normal end: the coordinator and servers exit once every
                # worker said it is done, which can be before the worker processes exit.
                if code is not None and code != 0 and not job_over(p):
                    self._say(
                        f"{p.source} exited with status {_describe(code)} while "
                        "workers were running; stopping the job"
                    )
                    return 1
            time.sleep(0.05)

    def _replace_coordinator(self, p: _Proc, code: int, workers: list[_Proc]) -> None:
        """The coordinator died (status ``code``, a signal's) while the job ran: start
        its replacement at the same address, which the job's members rejoin
        (:mod:`trimtab.roles.coordinator.rejoin`), told which workers ended already.
        Never blocks."""
        self._procs.remove(p)
        c = self.config
        done = [w.rank for w in workers if w.handle.poll() == 0]
        number = self.coordinator_failovers + 1
        argv = replacement_argv(c, HOST, self._checkpoint, self.coordinator_address, done, number)
        self._say(f"the coordinator died ({_describe(code)}); its replacement starts at "
                  f"{self.coordinator_address} and the job's members rejoin it")  # fmt: skip
        self._spawn("coordinator", 0, argv, self._role_env(), late=True)
        self.coordinator_failovers += 1

    def _injected(self, p: _Proc, code: int) -> bool:
        """Whether ``p``'s death (status ``code``) was a ``--fault`` kill; says so the
        first time. Blocks until its output is read (up to 2 s)."""
        if any(m.get("source") == p.source for m in self.faults.injected):
            return True
        p.reader.join(timeout=2.0)  # its marker line, if any, is read by now
        body = self.faults.injected_death(p.source, code)
        if body is None:
            return False
        body["source"] = p.source
        self._say(f"{p.source} was killed by --fault {body['spec']}; the job goes on without it")
        return True

    def _join_workers(self) -> None:
        """Start the workers whose ``--fault`` join is due (a worker reached its step),
        as workers given the job's address and no rank. Blocks for one status request."""
        reply = self._status()
        if reply is None:
            return
        due = self.faults.due_joins(headers.read_status_reply(reply)["clocks"])
        started = sum(p.source.startswith("worker") for p in self._procs)
        for rank in range(started, started + due):
            self._say(f"--fault: a worker joins the job (worker {rank})")
            self._spawn_worker(rank)  # the coordinator gives it the next free rank
