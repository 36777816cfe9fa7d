"""Whose turn it is on a worker's data sockets (:mod:`.client`): the credit thread's,
or that of a thread waiting for replies, which then reads them itself.

While pushes are held back for credit, or values are owed, the credit thread reads the
sockets, so that each CREDIT sends the next held push even while the training thread
computes. Once a thread waits for replies (a step's values), the credit thread steps
aside and the waiting thread reads them: each value is read by the thread that writes it
into the parameters, not read by one thread and handed to another (a wake-up and a
thread switch per chunk, which cost a 2-core machine about 20 us of CPU a chunk:
``trimtab bench msgcost``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

__all__ = ["Turns"]


class Turns:
    """The turn-taking of one worker's data sockets. Thread-safe; never blocks beyond
    a short lock (but :meth:`pause`, which waits for a wake-up).

    Args:
        busy: whether the credit thread has work (pushes held, values owed).
    """

    def __init__(self, busy: Callable[[], bool]) -> None:
        self._busy = busy
        self._wanted = threading.Event()  # the credit thread's wake-up
        self._lock = threading.Lock()
        #: Threads waiting for replies: while any is, the credit thread stays off.
        self.waiting = 0

    def wake(self) -> None:
        """Wake the credit thread: it may have work. (Setting the event costs a lock and
        a notify: done only when it is not set already.)"""
        if not self._wanted.is_set():
            self._wanted.set()

    def pause(self, timeout_s: float) -> None:
        """The credit thread: wait for a wake-up (at most ``timeout_s``). Blocks."""
        self._wanted.wait(timeout_s)
        self._wanted.clear()

    @contextlib.contextmanager
    def receiving(self) -> Iterator[None]:
        """While in it, the calling thread has the turn whenever it waits for a reply
        (and reads the sockets itself); the credit thread stays off them. On leaving,
        the credit thread takes over again if it has work."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def enter(self) -> None:
        """A thread begins to wait for replies (as :meth:`receiving`, without a
        generator's cost, for a wait per reply)."""
        with self._lock:
            self.waiting += 1

    def leave(self) -> None:
        """A thread stops waiting (each :meth:`enter` ends with one)."""
        with self._lock:
            self.waiting -= 1
            last = self.waiting == 0
        if last and self._busy():
            self._wanted.set()  # the credit thread takes the sockets back
