"""The launcher's processes (:mod:`.job`): how each is started, described and printed."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from trimtab.roles.coordinator.checkpoint import CHECKPOINT_FAILED_STATUS
from trimtab.runtime.diagnostics import STACK_SIGNAL

if TYPE_CHECKING:
    from trimtab.launch.backends.base import RoleHandle

__all__ = [
    "ENDED",
    "JOINER_EXIT_S",
    "SERVER_EXIT_S",
    "Proc",
    "await_end",
    "describe",
    "die_with_parent",
    "dump_stacks",
    "end_status",
    "job_over",
    "late_joiners",
    "lost_with_parent",
    "print_prefixed",
    "stop_after_end",
    "stop_late",
]

#: The coordinator's statuses at a job's end: every worker done (the second: its last
#: checkpoint failed, which the job's status says once the workers finished).
ENDED = (0, CHECKPOINT_FAILED_STATUS)

#: How long after the coordinator's normal exit a server it told to stop has to exit
#: on its own (it does in milliseconds) before the launcher stops it (:func:`stop_after_end`).
SERVER_EXIT_S = 1.0

#: How long after the coordinator's normal exit a worker started to join (``--fault
#: worker:+1@STEP``, ``trimtab scale``) that the coordinator never counted as a member
#: may still run before the launcher stops it (:func:`stop_late`): it is still starting,
#: or waiting for a coordinator that is gone. One it counted (it may have joined just
#: before the end and be finishing its script) gets the job's grace.
JOINER_EXIT_S = 3.0


def print_prefixed(source: str, line: str) -> None:
    """The default output handler: ``[worker 0] line`` on stdout. Never blocks long."""
    sys.stdout.write(f"[{source}] {line}\n")
    sys.stdout.flush()


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """In a child before exec: if the launcher is killed outright, the kernel stops its
    children too (Linux's PR_SET_PDEATHSIG). Never raises."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def lost_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """As :func:`die_with_parent`, but killed outright (``SIGKILL``): a role whose Ray
    actor died is lost at once, as on a node that died. Never raises."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclasses.dataclass
class Proc:
    """A role the launcher started: its name in the output, its handle (from the
    backend that started it), and the thread reading its output."""

    source: str
    handle: RoleHandle
    reader: threading.Thread

    @property
    def rank(self) -> int:
        """The index in its name (``worker 2``: 2). Never blocks."""
        return int(self.source.split()[-1])


def describe(code: int) -> str:
    """An exit status for a message: ``-9 (killed by SIGKILL)``, or the number."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


def dump_stacks(procs: Iterable[Proc]) -> None:
    """Ask every live process of ``procs`` for its threads' stacks (each prints them and
    goes on). Blocks one second, for the stacks to reach the output."""
    for p in procs:
        if p.handle.poll() is None:
            p.handle.signal(STACK_SIGNAL)
    time.sleep(1.0)


def end_status(others: Iterable[Proc], lost: bool) -> int:
    """The job's status once every worker exited and ``others`` (the coordinator and
    servers) ended or were given their grace: 1 if the coordinator ended the job with
    workers ``lost`` (too few left), or said its last checkpoint failed
    (:data:`CHECKPOINT_FAILED_STATUS`), else 0. Never blocks."""
    codes = {p.source: p.handle.returncode for p in others}
    if codes.get("coordinator") == 0:
        # It ended the job normally (every worker it knew said it was done): a server
        # its engine reported lost only now (a Ray node's actors, declared dead after
        # the job went on without them) changes nothing.
        return 0
    if lost and any(codes.values()):
        return 1
    return int(bool(codes.get("coordinator")))


def job_over(p: Proc) -> bool:
    """Whether ``p`` is the coordinator, exited at the job's end (a status of
    :data:`ENDED`). Never blocks."""
    return p.source == "coordinator" and p.handle.poll() in ENDED


def late_joiners(
    workers: Iterable[Proc], first: int, members: set[int], since_s: float, grace_s: float
) -> list[Proc]:
    """Of ``workers``, those started to join (rank ``first`` and up) that the launcher
    stops ``since_s`` after the coordinator's normal exit: each the coordinator never
    counted as one of its ``members`` once :data:`JOINER_EXIT_S` passed, every one once
    ``grace_s`` did. Never blocks."""
    joiners = [p for p in workers if p.rank >= first]
    if since_s > grace_s:
        return joiners
    if since_s > JOINER_EXIT_S:
        return [p for p in joiners if p.rank not in members]
    return []


def stop_late(procs: Iterable[Proc], say: Callable[[str], None]) -> list[Proc]:
    """Stop (SIGTERM) each process of ``procs`` still running: workers started to join a
    job that has ended since (the coordinator exited normally, so every worker it knew
    said it was done). Returns those stopped. Never blocks."""
    return _terminate(procs, say, "was started to join the job, which ended first")


def stop_after_end(servers: Iterable[Proc], say: Callable[[str], None]) -> list[Proc]:
    """Stop (SIGTERM) each server of ``servers`` still running after the coordinator
    exited normally: one that never joined (started as the job ended, it would wait out
    the coordinator's timeout) stops at once, one still writing its checkpoint files
    finishes them first (``trimtab server`` handles SIGTERM so). Returns those stopped.
    Never blocks."""
    return _terminate(servers, say, "is still running after the job ended")


def _terminate(procs: Iterable[Proc], say: Callable[[str], None], why: str) -> list[Proc]:
    """SIGTERM to each of ``procs`` still running, each said with ``why``."""
    stopped = [p for p in procs if p.handle.poll() is None]
    for p in stopped:
        say(f"{p.source} {why}: stopping it")
        p.handle.terminate()
    return stopped


def await_end(procs: list[Proc], grace_s: float, say: Callable[[str], None]) -> None:
    """Wait up to ``grace_s`` for ``procs`` (the coordinator and servers) to exit once
    the workers have. Once the coordinator has exited 0, every server it knew was told
    to stop, and one still running :data:`SERVER_EXIT_S` later either never joined (it
    was starting as the job ended, and would wait out the coordinator's timeout) or is
    writing its last files: :func:`stop_after_end` stops it. Blocks."""
    deadline = time.monotonic() + grace_s
    coordinator = next((p for p in procs if p.source == "coordinator"), None)
    ended: float | None = None  # when the coordinator was seen to exit 0
    servers = [p for p in procs if p.source.startswith("server")]
    while time.monotonic() < deadline and any(p.handle.poll() is None for p in procs):
        if ended is None and coordinator is not None and coordinator.handle.poll() in ENDED:
            ended = time.monotonic()
        if ended is not None and servers and time.monotonic() - ended > SERVER_EXIT_S:
            stop_after_end(servers, say)
            servers = []
        time.sleep(0.05)


def stop_all(procs: list[Proc]) -> None:
    """Stop every process of ``procs`` and whatever each left in its process group (a
    data loader's workers): SIGTERM, up to 5 s to exit, then SIGKILL; then read the
    rest of their output. Blocks for that long at most; never raises for a process
    already gone."""
    live = [p for p in procs if p.handle.poll() is None]
    for p in live:
        p.handle.signal(signal.SIGTERM, group=True)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(p.handle.poll() is None for p in live):
        time.sleep(0.05)
    for p in procs:
        if p.handle.poll() is None:
            p.handle.signal(signal.SIGKILL, group=True)
            p.handle.wait(10.0)
        # Kill anything the process left in its group (e.g. a data loader worker).
        p.handle.signal(signal.SIGKILL, group=True)
    for p in procs:
        p.reader.join(timeout=2.0)
