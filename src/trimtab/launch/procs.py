"""The launcher's processes (:mod:`.job`): how each is started, described and printed."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable

from trimtab.runtime.diagnostics import STACK_SIGNAL

__all__ = ["Proc", "describe", "die_with_parent", "dump_stacks", "print_prefixed", "stop_late"]


def print_prefixed(source: str, line: str) -> None:
    """The default output handler: ``[worker 0] line`` on stdout. Never blocks long."""
    sys.stdout.write(f"[{source}] {line}\n")
    sys.stdout.flush()


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """In a child before exec: if the launcher is killed outright, the kernel stops its
    children too (Linux's PR_SET_PDEATHSIG). Never raises."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclasses.dataclass
class Proc:
    """A process the launcher started: its name in the output, its handle, and the thread
    reading its output."""

    source: str
    popen: subprocess.Popen[bytes]
    reader: threading.Thread


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
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.popen.pid, STACK_SIGNAL)
    time.sleep(1.0)


def stop_late(procs: Iterable[Proc], say: Callable[[str], None]) -> list[Proc]:
    """Stop (SIGTERM) each process of ``procs`` still running: workers started to join a
    job that has ended since (the coordinator exited normally, so every worker it knew
    said it was done). Returns those stopped. Never blocks."""
    stopped = [p for p in procs if p.popen.poll() is None]
    for p in stopped:
        say(f"{p.source} was started to join the job, which ended first: stopping it")
        with contextlib.suppress(ProcessLookupError):
            p.popen.terminate()
    return stopped
