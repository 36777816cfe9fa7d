"""The worker's node runtime: handles (futures) for every remote operation, over two
sets of sockets.

- The **control** sockets (to the coordinator) belong to one I/O thread, which also
  sends heartbeats and notices the job's end: any thread may queue a control request,
  and the I/O thread is woken to send it.
- The **data** sockets (to the servers) belong to no thread: whoever holds the data
  lock uses them. A data request is sent by the calling thread itself, and its reply is
  received by the thread that waits for it (:func:`wait`), so a push and its answer
  cross no thread hand-off (each hand-off cost more than a raw ZeroMQ round trip here).

Remote operations return a :class:`concurrent.futures.Future` at once; waiting is
explicit (:func:`wait`). Replies are matched to requests by request id.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple, cast

from trimtab.errors import (
    ChunkMoved,
    ConfigError,
    JobAborted,
    NodeTimeout,
    ProtocolError,
    RemoteError,
    RetryableError,
)
from trimtab.protocol import headers
from trimtab.protocol.messages import (
    Control,
    Data,
    ErrorCode,
    Header,
    WireHeader,
    decode,
    encode,
    payload_frames,
)
from trimtab.runtime.loop import Heartbeat
from trimtab.transport import Frame, Peer, Transport, ZmqTransport
from trimtab.transport.zmq import check_spin

log = logging.getLogger("trimtab.worker")


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """How a worker joins its job.

    Attributes:
        coordinator: the coordinator's address, ``tcp://host:port``.
        job: the job id.
        rank: the rank to ask for; -1 lets the coordinator choose.
        heartbeat_s: seconds between heartbeats.
        coordinator_timeout_s: the job is considered dead if the coordinator is
            silent this long.
        request_timeout_s: the longest wait for any single reply.
        spin_s: seconds a wait for a server's reply polls before it sleeps
            (``TRIMTAB_SPIN_US``; 0: it sleeps at once).
        shared_memory: whether pushes to servers on this machine may go through a
            shared-memory arena (``TRIMTAB_SHM=0`` at ``init()`` turns it off).
    """

    coordinator: str
    job: str
    rank: int = -1
    heartbeat_s: float = 1.0
    coordinator_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    spin_s: float = 0.0
    shared_memory: bool = True

    def __post_init__(self) -> None:
        check_spin(self.spin_s)
        if not self.coordinator.startswith(("tcp://", "inproc://")):
            raise ConfigError(
                f"coordinator address {self.coordinator!r} must look like tcp://HOST:PORT; "
                "set TRIMTAB_COORDINATOR or run under `trimtab run`"
            )


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


class _DataFuture(concurrent.futures.Future[Reply]):
    """The future of a data request: waiting for it receives on the data sockets.
    ``epoch`` is the placement epoch the request was routed by (its header's ``e``: an
    int in a PUSH, PULL or INIT, absent from a STATS)."""

    def __init__(self, client: WorkerClient, epoch: object) -> None:
        super().__init__()
        self.client = client
        self.epoch = epoch


def wait(future: concurrent.futures.Future[Reply], timeout_s: float) -> Reply:
    """Block until ``future`` is done; return its reply. For a data request, the calling
    thread receives replies itself meanwhile (and completes others' futures too).

    Raises the remote error (:class:`RemoteError`, :class:`ChunkMoved`,
    :class:`SharedMemoryRefused`), :class:`JobAborted`, or :class:`NodeTimeout` after ``timeout_s``.
    """
    if isinstance(future, _DataFuture):
        future.client._drive(future, timeout_s)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise NodeTimeout(f"no reply within {timeout_s:.0f}s; is the job still running?") from None


class WorkerClient:
    """A worker's connection to its job. Thread-safe for :meth:`request`.

    :meth:`start` blocks until registered and raises :class:`JobAborted` or
    :class:`NodeTimeout` if the coordinator does not answer.
    """

    def __init__(self, config: WorkerConfig, transport: Transport | None = None) -> None:
        self.config = config
        self._transport = transport or ZmqTransport(bind=False)
        self._coord = self._transport.connect(config.coordinator)
        self._data = self._transport.companion()
        # Only the data sockets spin: their waits are a reply's, due within microseconds.
        self._data.spin_s = config.spin_s
        self._data_lock = threading.Lock()
        self._data_out: collections.deque[tuple[str, list[Frame]]] = collections.deque()
        self._rids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future[Reply]] = {}
        self._lock = threading.Lock()
        self._outbox: collections.deque[tuple[Peer | str, list[Frame]]] = collections.deque()
        self._heartbeat = Heartbeat(config.heartbeat_s, config.coordinator_timeout_s)
        self._running = False
        self._closing = False  # close() began: the coordinator may go any moment
        self._dead: str | None = None
        self._thread: threading.Thread | None = None
        self.rank = -1
        #: What proves to servers that a data request is this worker's (REGISTERED's
        #: ``t``); every data request carries it, with the rank ``r``.
        self.credential = b""
        self.num_workers = 0
        self.num_servers = 0
        self.chunk_bytes = 0
        #: The epoch of the placement map this worker routes by (its Context sets it).
        self.map_epoch = 0

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the I/O thread and register with the coordinator. Blocks."""
        self._running = True
        self._thread = threading.Thread(target=self._io_loop, name="trimtab-io", daemon=True)
        self._thread.start()
        fut = self.control(headers.register_worker(rank=self.config.rank))
        reply = headers.read_registered(wait(fut, self.config.coordinator_timeout_s).header)
        self.rank = reply["rank"]
        self.credential = reply.get("t", b"")
        self.num_workers = reply["num_workers"]
        self.num_servers = reply["num_servers"]
        self.chunk_bytes = reply["chunk_bytes"]

    def close(self, *, done: bool = True, failed: str | None = None) -> None:
        """Tell the coordinator this worker is done (if ``done``; with ``failed``, that
        its process ends because of that failure), stop the I/O thread. Blocks briefly;
        never raises."""
        if not self._running:
            return
        self._closing = True
        if done and self._dead is None:
            try:
                wait(self.control(headers.done(failed=failed)), 10.0)
            except Exception as exc:
                log.warning("could not tell the coordinator we are done: %s", exc)
        self._running = False
        self._transport.wake()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        if self._data_lock.acquire(timeout=10.0):
            try:
                self._data.close()
            finally:
                self._data_lock.release()

    @property
    def dead(self) -> str | None:
        """Why the job is over, or ``None`` while it runs."""
        return self._dead

    def describe(self) -> str:
        """Its requests in flight, for a hung job's dump. Only reads; never blocks."""
        rids = sorted(self._pending)
        shown = ", ".join(map(str, rids[:20])) + (" ..." if len(rids) > 20 else "")
        return f"{len(rids)} requests unanswered ({shown}), {len(self._data_out)} not yet sent"

    def routing_floor(self) -> int:
        """The oldest placement epoch by which a data request of this worker is still
        unanswered, or :attr:`map_epoch` if none is older. Sent to the coordinator with
        every MAP_GET, REPORT and heartbeat (``lo``): it retires a drained server only
        once every worker's floor is past the map that emptied it, since until then a
        request sent by an older map may still reach that server (and be answered
        *moved*). Never blocks (beyond a short lock)."""
        with self._lock:
            epochs = [
                f.epoch
                for f in self._pending.values()
                if isinstance(f, _DataFuture) and isinstance(f.epoch, int)
            ]
        return min([self.map_epoch, *epochs])

    # -- requests ------------------------------------------------------------------

    def control(
        self, header: Header | WireHeader, frames: Sequence[Frame] = ()
    ) -> concurrent.futures.Future[Reply]:
        """Send a request to the coordinator; the future gets its reply. Non-blocking."""
        return self.request(self._coord, header, frames)

    def request(
        self, to: Peer | str, header: Header | WireHeader, frames: Sequence[Frame] = ()
    ) -> concurrent.futures.Future[Reply]:
        """Send ``header`` + ``frames`` to a peer (the coordinator's, through the I/O
        thread) or to a server address (data: sent from this thread unless another
        holds the data sockets); return a future of the reply. Non-blocking;
        thread-safe. The frames' memory must stay unchanged until the future is done.

        ``header`` is a builder's typed header (:mod:`trimtab.protocol.headers`) or a
        plain dict; this sets its ``i`` (the request id) and ``j``, and for a data
        request this worker's rank ``r`` and credential ``t``."""
        data = isinstance(to, str)
        fut: concurrent.futures.Future[Reply] = (
            _DataFuture(self, header.get("e")) if data else concurrent.futures.Future()
        )
        rid = next(self._rids)
        header["i"] = rid  # even for a job that is over: callers read the id back
        header["j"] = self.config.job
        if self._dead is not None:
            fut.set_exception(JobAborted(self._dead))
            return fut
        with self._lock:
            self._pending[rid] = fut
        if isinstance(to, str):
            plain = cast(Header, header)
            plain["r"] = self.rank
            plain["t"] = self.credential
            self._data_out.append((to, [encode(header), *frames]))
            if not self._flush_data():
                self._data.wake()  # the thread receiving on the data sockets sends it
        else:
            self._outbox.append((to, [encode(header), *frames]))
            self._transport.wake()
        return fut

    # -- the data sockets: used by whichever thread holds the data lock --------------

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
            self._data.send(self._data.connect(to), frames)

    def _drive(self, fut: _DataFuture, timeout_s: float) -> None:
        """Receive on the data sockets until ``fut`` is done or ``timeout_s`` passed,
        completing whichever futures the replies answer. Blocks; never raises (the
        caller reads the outcome from ``fut``)."""
        deadline = time.monotonic() + timeout_s
        while not fut.done():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not self._data_lock.acquire(blocking=False):
                # Another thread is receiving; it completes our future too.
                concurrent.futures.wait([fut], timeout=min(left, 0.005))
                continue
            try:
                self._send_data_locked()
                # Short slices, so a job that ended (the I/O thread fails every future)
                # or a request queued by another thread is seen soon.
                env = self._data.recv(min(left, 0.05))
                while env is not None:
                    self._on_message(env.peer, env.frames)
                    if fut.done():
                        break
                    env = self._data.recv(0)
            except Exception as exc:  # a broken data socket ends the job, said once
                log.exception("worker data sockets failed")
                self._fail(f"worker data sockets failed: {exc}")
            finally:
                self._data_lock.release()
            self._flush_data()

    # -- the I/O thread ------------------------------------------------------------

    def _io_loop(self) -> None:
        try:
            while self._running:
                while self._outbox:
                    to, frames = self._outbox.popleft()
                    peer = self._transport.connect(to) if isinstance(to, str) else to
                    self._transport.send(peer, frames)
                if self._heartbeat.due():
                    # A worker between steps (at a barrier, say) sends no REPORT: its
                    # heartbeat's floor still lets a drained server retire.
                    floor = self.routing_floor() if self.map_epoch else None
                    beat = headers.worker_heartbeat(job=self.config.job, floor=floor)
                    self._transport.send(self._coord, [encode(beat)])
                env = self._transport.recv(self.config.heartbeat_s)
                if env is None:
                    gone = self._heartbeat.gone(self._transport.lost(), self._coord)
                    if gone is not None:
                        self._fail(gone, quiet=self._closing)
                    continue
                if env.peer == self._coord:
                    self._heartbeat.heard()
                self._on_message(env.peer, env.frames)
        except Exception as exc:  # the I/O thread must never die silently
            log.exception("worker I/O thread failed")
            self._fail(f"worker I/O thread failed: {exc}")
        finally:
            self._transport.close()

    def _on_message(self, peer: Peer, frames: list[memoryview]) -> None:
        try:
            header = decode(frames[0], self.config.job)
        except ProtocolError as exc:
            log.error("dropped an undecodable message from %r: %s", peer, exc)
            return
        op = header["o"]
        if peer == self._coord and op in (Control.ABORT, Control.SHUTDOWN):
            self._fail(str(header.get("why", "the job was shut down")))
            return
        if op == Control.HEARTBEAT:
            return
        with self._lock:
            fut = self._pending.pop(header["i"], None)
        if fut is None:
            log.warning("reply to unknown request %s (op %s)", header["i"], op)
            return
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

    def _fail(self, why: str, *, quiet: bool = False) -> None:
        if self._dead is None:
            self._dead = why
            if not quiet:  # (quiet: the coordinator going after our DONE is no news)
                log.error("job over: %s", why)
        self._running = False
        with self._lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(JobAborted(why))
