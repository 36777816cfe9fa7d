"""A worker's data sockets (to the servers), which belong to no thread: whoever holds
the data lock uses them.

A data request is sent by the calling thread itself, and its reply is received by the
thread that waits for it (:meth:`DataSockets.drive`), so a push and its answer cross no
thread hand-off (each hand-off cost more than a raw ZeroMQ round trip here). One
exception: while the credit gate (:mod:`trimtab.runtime.credit`) holds pushes back or
values are owed, and no thread waits for a reply, the credit thread takes the data
lock, to read the CREDITs that release them (and the replies that come with them); it
steps aside as soon as a thread waits (:mod:`.turns`).

What a reply means (its future, its credit) is the client's
(:class:`~trimtab.roles.worker.client.WorkerClient`, which is one of these): this
module sends and receives, and hands every message read to its ``_on_message``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Sequence

from trimtab.protocol.credit import CreditFrames
from trimtab.protocol.messages import Data, Header, encode
from trimtab.roles.worker.batching import HeldRequests
from trimtab.roles.worker.config import WorkerConfig
from trimtab.roles.worker.replies import DONE, DataFuture
from trimtab.roles.worker.turns import Turns
from trimtab.runtime.credit import CreditGate
from trimtab.transport import Frame, Peer, Transport

log = logging.getLogger("trimtab.worker")

__all__ = ["DataSockets"]

#: The longest wait of :meth:`DataSockets.drive` for one message (seconds): a job that
#: ended, or a request another thread queued, is seen within it.
_SLICE_S = 0.05
#: Messages :meth:`DataSockets.drive` reads in a row, none completing its future,
#: before it looks at the clock again.
_UNTIMED = 64


class DataSockets:
    """The data sockets of one worker, and the turns of the threads that use them.
    Thread-safe.

    Args:
        config: the worker's settings (its job, spin and credit window).
        transport: the worker's transport; the data sockets are its companion.
    """

    #: This worker's rank and credential, stamped on every data request (the client
    #: sets them once registered).
    rank: int
    credential: bytes

    def __init__(self, config: WorkerConfig, transport: Transport) -> None:
        self.config = config
        self._data = transport.companion()
        # Only the data sockets spin: their waits are a reply's, due within microseconds.
        self._data.spin_s = config.spin_s
        self._data_lock = threading.Lock()
        self._data_out: collections.deque[tuple[str, list[Frame]]] = collections.deque()
        self._rids = itertools.count(1)  # every request's id, control and data
        self._held = HeldRequests()  # data requests to go together (batching.py)
        #: The bound on push bytes in flight per server, or None (no bound); a window of
        #: one chunk (-1) is set once the job's chunk size is known (client's start).
        self.credit: CreditGate[str, tuple[str, list[Frame]]] | None = None
        if config.credit_bytes != 0:
            window = max(config.credit_bytes, 1)
            self.credit = CreditGate(window, ordered=config.credit_ordered)
        self._owed: set[int] = set()  # request ids of pushes whose reply is unread
        #: Pushes admitted to the credit gate (maybe held) and not yet credited, by
        #: request id: the server each went to. A reply credits its push only if it is
        #: here (from that server), so the usual reply, whose CREDIT came first, skips
        #: the gate and its lock. Every id is added before its push may be sent.
        self._uncredited: dict[int, str] = {}
        self._servers: dict[Peer, str] = {}  # a data peer's name -> its server's address
        self._credit_frame = CreditFrames(config.job)
        # The credit thread's turn on the data sockets, or a waiting thread's.
        self._turns = Turns(
            lambda: bool(self._owed) or (self.credit is not None and self.credit.holding())
        )
        self._pump_thread: threading.Thread | None = None
        self._running = False

    # -- what the client does with a message read, and with a broken socket -----------

    def _on_message(self, peer: Peer, frames: list[memoryview]) -> None:
        """Take a message read off the data sockets (the client's). Never raises."""
        raise NotImplementedError

    def _fail(self, why: str, *, quiet: bool = False) -> None:
        """End the job: every request fails (the client's). Never raises."""
        raise NotImplementedError

    # -- sending ---------------------------------------------------------------------

    def _send_data(
        self, to: str, rid: int, plain: Header, frames: Sequence[Frame], held: bool
    ) -> None:
        """Stamp a data request (``i`` and ``j`` already set) with the rank and
        credential, and send it: held for a BATCH (``held``), held back by the credit
        gate, or now if the data sockets are free (else whoever holds them sends it).
        Non-blocking."""
        plain["r"] = self.rank
        plain["t"] = self.credential
        if held:  # (no credit: a batch's replies come in one message)
            self._held.hold(to, rid, [encode(plain), *frames])
            return
        gate = self.credit
        if gate is not None and frames and plain["o"] == Data.PUSH:
            # Bytes through a socket (not shared memory, not inline): bounded, and so
            # are the values sent back (vk: the window the server holds them to).
            plain["ak"] = True
            plain["vk"] = gate.window
            self._owed.add(rid)
            self._uncredited[rid] = to
            self._turns.wake()
            message = (to, [encode(plain), *frames])
            nbytes = 0
            for f in frames:  # (a loop, not sum() over a generator: one call fewer)
                nbytes += memoryview(f).nbytes
            if not gate.admit(to, rid, nbytes, int(plain.get("c", 0)), message):
                return  # (the pump, woken above, reads the credit that releases it)
            self._data_out.append(message)
        else:
            if gate is not None:  # a push resent through shared memory: no credit
                plain.pop("ak", None)
                plain.pop("vk", None)
            self._data_out.append((to, [encode(plain), *frames]))
        if not self._flush_data():
            self._data.wake()  # the thread receiving on the data sockets sends it

    def flush_held(self) -> None:
        """Send the row requests made ``held`` (the client's ``request``; any wait for a
        reply flushes them first), one BATCH per server. Non-blocking; thread-safe."""
        extra = {"r": self.rank, "t": self.credential}
        self._data_out.extend(self._held.take(self._rids, self.config.job, extra))
        if not self._flush_data():
            self._data.wake()

    def _flush_data(self) -> bool:
        """Send the queued data requests, if the data sockets are free; return whether
        the queue was emptied. Non-blocking."""
        while self._data_out:
            if not self._data_lock.acquire(blocking=False):
                return False
            try:
                self._send_data_locked()
            finally:
                self._data_lock.release()
        return True

    def _send_data_locked(self) -> None:
        while self._data_out:
            to, frames = self._data_out.popleft()
            self._data.send_to(to, frames)

    # -- receiving -------------------------------------------------------------------

    def drive(self, fut: DataFuture, timeout_s: float, *, turn_held: bool = False) -> None:
        """Receive on the data sockets until ``fut`` is done or ``timeout_s`` passed (give
        or take one :data:`_SLICE_S` of waiting), completing whichever futures the replies
        answer. The credit thread steps aside meanwhile; ``turn_held``: the caller is in
        :meth:`receiving` already (a step's values), so this does not take a turn of its
        own. Blocks; never raises (the caller reads the outcome from ``fut``)."""
        if self._held.by_address:  # (self._held's __bool__, without its call)
            self.flush_held()
        # (fut._state in DONE: fut.done() without its call, twice a message below)
        if fut._state in DONE:
            return
        deadline = time.monotonic() + timeout_s
        slice_s = timeout_s if timeout_s < _SLICE_S else _SLICE_S  # (min(): a call)
        out, send_to, recv = self._data_out, self._data.send_to, self._data.recv
        left = timeout_s
        if not turn_held:
            self._turns.enter()
        try:
            while fut._state not in DONE:
                if left <= 0:
                    return
                if not self._data_lock.acquire(blocking=False):
                    # The credit thread (woken: it steps aside) or another waiting
                    # thread, which completes our future too.
                    self._data.wake()
                    if not self._data_lock.acquire(timeout=min(left, 0.005)):
                        left = deadline - time.monotonic()
                        continue
                try:
                    if out:
                        self._send_data_locked()
                    # Short slices, so a job that ended (the I/O thread fails every
                    # future) or a request queued by another thread is seen soon.
                    env = recv(left if left < slice_s else slice_s)
                    # Messages not ours read in a row before the clock is looked at
                    # again (a look a message cost a call or two a chunk).
                    budget = _UNTIMED
                    while env is not None:
                        self._on_message(env.peer, env.frames)
                        # What the message released (a push, a value's CREDIT), sent:
                        # _send_data_locked, inlined.
                        while out:
                            to, frames = out.popleft()
                            send_to(to, frames)
                        if fut._state in DONE:
                            break
                        # Not ours (a CREDIT, another's value): wait on with the sockets
                        # held; a wake-up (another thread's request) or a slice with
                        # nothing ends the wait (the loop above then looks at the time).
                        budget -= 1
                        if not budget:
                            break
                        env = recv(slice_s)
                except Exception as exc:  # a broken data socket ends the job, said once
                    log.exception("worker data sockets failed")
                    self._fail(f"worker data sockets failed: {exc}")
                finally:
                    self._data_lock.release()
                if out:
                    self._flush_data()
                if fut._state not in DONE:
                    left = deadline - time.monotonic()
        finally:
            if not turn_held:
                self._turns.leave()

    def receiving(self) -> contextlib.AbstractContextManager[None]:
        """While in it, the calling thread reads the data sockets itself whenever it
        waits for a reply (:func:`~trimtab.roles.worker.replies.wait`), and the credit
        thread stays off them: a caller that waits for many replies in a row (a step's
        values) holds it around them all (:class:`~trimtab.roles.worker.turns.Turns`).
        Never blocks."""
        return self._turns.receiving()

    def _start_pump(self) -> None:
        """Start the credit thread, if there is a credit gate. Never blocks."""
        if self.credit is not None:
            self._pump_thread = threading.Thread(
                target=self._pump, name="trimtab-credit", daemon=True
            )
            self._pump_thread.start()

    def _pump(self) -> None:
        """The credit thread: while the gate holds pushes or values are owed, and no
        thread waits for a reply (:meth:`drive`, which then reads them itself),
        receive on the data sockets so that each CREDIT sends the next held push even
        while the training thread computes. Blocks until the client stops."""
        gate = self.credit
        assert gate is not None
        while self._running:
            self._turns.pause(0.1)
            while self._running and not self._turns.waiting and (self._owed or gate.holding()):
                if not self._data_lock.acquire(timeout=0.05):
                    continue
                try:
                    self._send_data_locked()
                    env = self._data.recv(0.01)
                    while env is not None:
                        self._on_message(env.peer, env.frames)
                        self._send_data_locked()
                        env = None if self._turns.waiting else self._data.recv_queued()
                    self._send_data_locked()
                except Exception as exc:  # as in drive: a broken data socket ends the job
                    log.exception("worker data sockets failed")
                    self._fail(f"worker data sockets failed: {exc}")
                    return
                finally:
                    self._data_lock.release()

    def _close_data(self) -> None:
        """Stop the credit thread (the client's running flag is already down) and close
        the data sockets. Blocks up to 20 s."""
        if self._pump_thread is not None:
            self._turns.wake()
            self._pump_thread.join(timeout=10.0)
        if self._data_lock.acquire(timeout=10.0):
            try:
                self._data.close()
            finally:
                self._data_lock.release()
