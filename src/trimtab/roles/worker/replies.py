"""What a worker's data requests end with: a :class:`Reply`, or, where a server cannot
map this worker's shared memory, :class:`SharedMemoryRefused`; and the futures that
carry them (:class:`DataFuture`, :func:`wait`)."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from trimtab.errors import ChunkMoved, NodeTimeout, ProtocolError, RemoteError, RetryableError
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, Data, ErrorCode, Header, payload_frames

log = logging.getLogger("trimtab.worker")

# A future's states, as concurrent.futures names them.
_PENDING, _RUNNING, _FINISHED = "PENDING", "RUNNING", "FINISHED"
_CANCELLED_STATE, _NOTIFIED = "CANCELLED", "CANCELLED_AND_NOTIFIED"
_CANCELLED = frozenset((_CANCELLED_STATE, _NOTIFIED))
_DONE = frozenset((_FINISHED, _CANCELLED_STATE, _NOTIFIED))
#: The states of a done future: ``fut._state in DONE`` is :meth:`DataFuture.done`
#: without a call, where one a message counts (the data sockets' receive loop).
DONE = _DONE
#: The state of a future with a reply or an exception (not cancelled).
FINISHED = _FINISHED


class SharedMemoryRefused(RetryableError):
    """A server cannot map this worker's shared memory (another machine, another
    ``/dev/shm``): send it the push's bytes instead, and from then on. Recovered from
    where pushes are sent; not an error of the job.

    Attributes:
        code: ``no_shm``, the code the server answered.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode.NO_SHM.value


class Reply(NamedTuple):
    """A reply: its header, its buffers (which stay valid while referenced), and when
    this process read it off its socket (``time.perf_counter()``)."""

    header: Header
    frames: list[memoryview]
    at: float = 0.0


class Receiver(Protocol):
    """What reads a data request's reply off the sockets while a thread waits for it
    (a :class:`~trimtab.roles.worker.client.WorkerClient`)."""

    def drive(self, fut: DataFuture, timeout_s: float) -> None:
        """Receive until ``fut`` is done or ``timeout_s`` passed. Blocks; never raises."""


class DataFuture(concurrent.futures.Future[Reply]):
    """The future of a data request: waiting for it receives on the data sockets.
    ``epoch`` is the placement epoch the request was routed by (its header's ``e``: an
    int in a PUSH, PULL or INIT, absent from a STATS); ``address`` the server's, and
    ``chunk`` the request's ``c`` (-1 for none), for a failover to fail it as moved.

    A :class:`concurrent.futures.Future` in all it does, but made and completed without
    its :class:`threading.Condition`: a chunk's push makes one, and the condition's
    Python-level locking (in ``done()``, ``set_result()`` and ``result()``, several
    times a chunk) was about a fifth of the worker's Python calls per chunk (``trimtab
    bench msgcost``). A plain lock guards its changes; a thread that must sleep for it
    (:meth:`result` before it is done) sleeps on a lock of its own, which completing
    it releases. Not for :func:`concurrent.futures.wait` or ``as_completed`` (which
    reach into the condition); :func:`wait` below is how it is waited for.
    """

    def __init__(self, client: Receiver, epoch: object, address: str, chunk: object) -> None:
        # (Future.__init__ is not called: it makes the condition this class does without.)
        self._mutex = threading.Lock()
        self._state = _PENDING
        self._result: Reply | None = None
        self._exception: BaseException | None = None
        self._sleepers: list[threading.Lock] = []
        self._done_callbacks: list[Callable[[concurrent.futures.Future[Reply]], object]] = []
        self.client = client
        self.epoch = epoch
        self.address = address
        self.chunk = chunk if type(chunk) is int or isinstance(chunk, int) else -1

    def __repr__(self) -> str:
        return f"<DataFuture at {id(self):#x} state={self._state.lower()} chunk={self.chunk}>"

    def done(self) -> bool:
        """Whether it finished or was cancelled. Never blocks."""
        return self._state in _DONE

    def running(self) -> bool:
        return self._state == _RUNNING

    def cancelled(self) -> bool:
        return self._state in _CANCELLED

    def cancel(self) -> bool:
        with self._mutex:
            if self._state in (_RUNNING, _FINISHED):
                return False
            if self._state in _CANCELLED:
                return True
            self._state = _CANCELLED_STATE
        self._wake()
        return True

    def set_running_or_notify_cancel(self) -> bool:
        with self._mutex:
            if self._state == _CANCELLED_STATE:
                self._state = _NOTIFIED
                return False
            if self._state != _PENDING:
                raise concurrent.futures.InvalidStateError(f"{self!r}: not pending")
            self._state = _RUNNING
            return True

    def set_result(self, result: Reply) -> None:
        """Complete it with ``result``, waking whoever sleeps for it. Never blocks
        (beyond a short lock); raises ``InvalidStateError`` if it is done already."""
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        """Complete it with ``exception``, as :meth:`set_result`."""
        self._finish(None, exception)

    def _finish(self, result: Reply | None, exception: BaseException | None) -> None:
        # (_wake's work, under the same hold of the lock: a sleeper that comes later
        # sees it done and does not sleep)
        with self._mutex:
            if self._state in _DONE:
                raise concurrent.futures.InvalidStateError(f"{self!r}: done already")
            self._result, self._exception = result, exception
            self._state = _FINISHED
            sleepers, self._sleepers = self._sleepers, []
        for sleeper in sleepers:
            sleeper.release()
        for fn in self._done_callbacks:
            self._call(fn)

    def result(self, timeout: float | None = None) -> Reply:
        """Its reply, or raise its exception, waiting up to ``timeout`` seconds (None:
        forever) for another thread to complete it (this one receives nothing: see
        :func:`wait`). Blocks; raises ``TimeoutError``, ``CancelledError``."""
        if self._state != _FINISHED:  # (finished: _sleep would return at once)
            self._sleep(timeout)
        if self._exception is not None:
            raise self._exception
        return self._result  # type: ignore[return-value]  # (set with it; cast() is a call)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Its exception (None if it has a reply), waiting as :meth:`result` does."""
        if self._state != _FINISHED:
            self._sleep(timeout)
        return self._exception

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[Reply]], object]) -> None:
        with self._mutex:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        self._call(fn)

    def _sleep(self, timeout: float | None) -> None:
        """Return once it is done; raise ``TimeoutError`` after ``timeout`` seconds, or
        ``CancelledError``."""
        if self._state not in _DONE:
            with self._mutex:
                sleeper = None
                if self._state not in _DONE:
                    sleeper = threading.Lock()
                    sleeper.acquire()
                    self._sleepers.append(sleeper)
            if sleeper is not None:
                sleeper.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        if self._state in _CANCELLED:
            raise concurrent.futures.CancelledError()
        if self._state != _FINISHED:
            raise concurrent.futures.TimeoutError()

    def _wake(self) -> None:
        """It is done: release its sleepers, call its callbacks."""
        with self._mutex:
            sleepers, self._sleepers = self._sleepers, []
        for sleeper in sleepers:
            sleeper.release()
        for fn in self._done_callbacks:
            self._call(fn)

    def _call(self, fn: Callable[[concurrent.futures.Future[Reply]], object]) -> None:
        try:
            fn(self)
        except Exception:
            log.exception("a callback of %r failed", self)


def wait(future: concurrent.futures.Future[Reply], timeout_s: float) -> Reply:
    """Block until ``future`` is done; return its reply. For a data request, the calling
    thread receives replies itself meanwhile (and completes others' futures too).

    Raises the remote error (:class:`RemoteError`, :class:`ChunkMoved`,
    :class:`SharedMemoryRefused`), :class:`JobAborted`, or :class:`NodeTimeout` after ``timeout_s``.
    """
    if isinstance(future, DataFuture):
        future.client.drive(future, timeout_s)  # (returns once it is done or timed out)
        timeout_s = 0.0
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise NodeTimeout(f"no reply within {timeout_s:.0f}s; is the job still running?") from None


def complete(
    fut: concurrent.futures.Future[Reply], header: Header, frames: list[memoryview]
) -> None:
    """Complete ``fut`` with the reply ``header`` (decoded) and ``frames`` (the whole
    message): an ERROR's :class:`RemoteError` (:class:`SharedMemoryRefused` for
    NO_SHM), a MOVED's :class:`ChunkMoved`, or the reply with its payload. Never
    blocks."""
    op = header["o"]
    if op in (Data.ERROR, Control.ERROR):
        code, msg = str(header.get("code")), str(header.get("msg"))
        if code == ErrorCode.NO_SHM.value:
            fut.set_exception(SharedMemoryRefused(msg))
        else:
            fut.set_exception(RemoteError(code, msg))
    elif op == Data.MOVED:
        try:
            moved = headers.read_moved(header)
        except ProtocolError as exc:  # the request fails, not the data sockets
            fut.set_exception(exc)
            return
        fut.set_exception(ChunkMoved(moved["c"], moved["s"], moved["e"]))
    else:
        try:
            payload = payload_frames(header, frames[1:])
        except ProtocolError as exc:
            fut.set_exception(exc)
            return
        fut.set_result(Reply(header, payload, time.perf_counter()))
