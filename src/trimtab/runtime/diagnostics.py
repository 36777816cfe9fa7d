"""Diagnostics for a hung job: on a signal, every thread's stack and each node's protocol
state. Standard library only, so the coordinator and the launcher can use it without torch."""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
from collections.abc import Callable
from typing import TextIO

#: Sent to a process of a job, makes it print every thread's stack to stderr and go on
#: (``kill -USR1 PID``; the launcher sends it to every process of a job that ran past
#: its deadline).
STACK_SIGNAL = signal.SIGUSR1


#: What each node of this process says of its protocol state on :data:`STACK_SIGNAL`
#: (see :func:`add_state_dump`).
_state_dumps: list[Callable[[], str]] = []


def enable_stack_dumps() -> None:
    """On :data:`STACK_SIGNAL`, print every thread's stack to stderr, then what each
    node of this process registered with :func:`add_state_dump` (its requests in
    flight, chunks, migrations: what a hung job needs explained), if the process does
    not handle that signal already and this is its main thread. Does not block or
    raise."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(STACK_SIGNAL) is signal.SIG_DFL:
        err = _stderr_file()
        if err is None:
            return  # (no stderr with a descriptor: nowhere to print the stacks)
        # The stacks come from faulthandler's own handler, which works whatever the
        # threads are doing; it then chains to this one, which runs in the main thread
        # at its next bytecode (a poll is interrupted and resumed for it).
        signal.signal(STACK_SIGNAL, _print_state)
        faulthandler.register(STACK_SIGNAL, file=err, all_threads=True, chain=True)


def _stderr_file() -> TextIO | None:
    """``sys.stderr`` if it has a file descriptor (faulthandler writes to one), else the
    process's own stderr (``sys.__stderr__``: stderr replaced by an object in memory, as
    pytest's capture does), else None. Never raises."""
    for err in (sys.stderr, sys.__stderr__):
        try:
            if err is not None:
                err.fileno()
                return err
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation too
            continue
    return None


def add_state_dump(describe: Callable[[], str]) -> Callable[[], None]:
    """Have ``describe()`` printed on :data:`STACK_SIGNAL` (after the stacks); returns
    the function that takes it back. ``describe`` runs in the main thread between two
    bytecodes of whatever it was doing, so it must only read. Never blocks or raises."""
    _state_dumps.append(describe)

    def remove() -> None:
        if describe in _state_dumps:
            _state_dumps.remove(describe)

    return remove


def _print_state(signum: int, frame: object) -> None:
    for describe in list(_state_dumps):
        try:
            text = describe()
        except Exception as exc:  # a half-updated structure: say so, never raise here
            text = f"(state unavailable: {type(exc).__name__}: {exc})"
        print(text, file=sys.stderr, flush=True)
