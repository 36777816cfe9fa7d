"""The worker's node runtime: handles (futures) for every remote operation, over two
sets of sockets.

- The **control** sockets (to the coordinator) belong to one I/O thread, which also
  sends heartbeats and notices the job's end: any thread may queue a control request,
  and the I/O thread is woken to send it.
- The **data** sockets (to the servers) belong to no thread: whoever holds the data
  lock uses them (:mod:`.datasockets`: sending, the credit thread, and a waiting
  thread driving them). What each message read means is decided here
  (:meth:`WorkerClient._on_message`): a future completed, a credit taken, a server
  lost, the job's end.

Remote operations return a :class:`concurrent.futures.Future` at once; waiting is
explicit (:func:`wait`). Replies are matched to requests by request id.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import cast

from trimtab.errors import (
    ChunkMoved,
    JobAborted,
    ProtocolError,
)
from trimtab.protocol import headers
from trimtab.protocol.messages import (
    Control,
    Data,
    Header,
    WireHeader,
    decode,
    encode,
)
from trimtab.protocol.replica import read_failover_notice
from trimtab.roles.worker.config import WorkerConfig
from trimtab.roles.worker.datasockets import DataSockets
from trimtab.roles.worker.failover import ControlFailover
from trimtab.roles.worker.news import MapNews
from trimtab.roles.worker.replies import DataFuture, Reply, complete, wait
from trimtab.runtime.loop import Heartbeat
from trimtab.runtime.trace import Trace
from trimtab.transport import Frame, Peer, Transport, ZmqTransport

log = logging.getLogger("trimtab.worker")

#: ``Reply(*fields)`` in one C call (a namedtuple's ``__new__`` is a Python lambda).
_reply = cast(
    Callable[[tuple[Header, list[memoryview], float]], Reply], partial(tuple.__new__, Reply)
)

__all__ = ["WorkerClient", "wait"]


class WorkerClient(DataSockets):
    """A worker's connection to its job. Thread-safe for :meth:`request`.

    :meth:`start` blocks until registered and raises :class:`JobAborted` or
    :class:`NodeTimeout` if the coordinator does not answer.
    """

    def __init__(self, config: WorkerConfig, transport: Transport | None = None) -> None:
        self._transport = transport or ZmqTransport(bind=False)
        self._coord = self._transport.connect(config.coordinator)
        super().__init__(config, self._transport)  # the data sockets: datasockets.py
        self._pending: dict[int, concurrent.futures.Future[Reply]] = {}
        self._lock = threading.Lock()
        self._outbox: collections.deque[tuple[Peer | str, list[Frame]]] = collections.deque()
        self._heartbeat = Heartbeat(config.heartbeat_s, config.coordinator_timeout_s)
        self._failover = ControlFailover(config, self._transport, self._coord, self._heartbeat)
        self._closing = False  # close() began: the coordinator may go any moment
        self._dead: str | None = None
        # Servers the job lost (FAILOVER): address -> the failover map's epoch.
        self._lost: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self.rank = -1
        self.trace: Trace | None = None  # --trace: its pusher's events, and clock samples
        #: What proves to servers that a data request is this worker's (REGISTERED's
        #: ``t``); every data request carries it, with the rank ``r``.
        self.credential = b""
        self.num_workers = 0
        self.num_servers = 0
        self.chunk_bytes = 0
        #: The epoch of the placement map this worker routes by (its Context sets it).
        self.map_epoch = 0
        #: The newest map the coordinator sent unasked (MAP_NEWS), until a step takes it.
        self.map_news = MapNews()

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start the I/O thread and register with the coordinator. Blocks."""
        self._running = True
        self._thread = threading.Thread(target=self._io_loop, name="trimtab-io", daemon=True)
        self._thread.start()
        self._start_pump()
        fut = self.control(headers.register_worker(rank=self.config.rank))
        reply = headers.read_registered(wait(fut, self.config.coordinator_timeout_s).header)
        self.rank = reply["rank"]
        self.credential = reply.get("t", b"")
        self.num_workers = reply["num_workers"]
        self.num_servers = reply["num_servers"]
        self.chunk_bytes = reply["chunk_bytes"]
        if self.credit is not None and self.config.credit_bytes < 0:
            self.credit.window = max(self.chunk_bytes, 1)

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
        self._close_data()

    @property
    def dead(self) -> str | None:
        """Why the job is over, or ``None`` while it runs."""
        return self._dead

    def describe(self) -> str:
        """Its requests in flight, for a hung job's dump. Only reads; never blocks."""
        rids = sorted(self._pending)
        shown = ", ".join(map(str, rids[:20])) + (" ..." if len(rids) > 20 else "")
        held = f"; {self.credit.describe()}" if self.credit is not None else ""
        return (
            f"{len(rids)} requests unanswered ({shown}), {len(self._data_out)} not yet sent" + held
        )

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
                if isinstance(f, DataFuture) and isinstance(f.epoch, int)
            ]
        return min([self.map_epoch, *epochs])

    # -- requests ------------------------------------------------------------------

    def control(
        self, header: Header | WireHeader, frames: Sequence[Frame] = ()
    ) -> concurrent.futures.Future[Reply]:
        """Send a request to the coordinator; the future gets its reply. Non-blocking."""
        return self.request(self._coord, header, frames)

    def request(
        self,
        to: Peer | str,
        header: Header | WireHeader,
        frames: Sequence[Frame] = (),
        *,
        held: bool = False,
    ) -> concurrent.futures.Future[Reply]:
        """Send ``header`` + ``frames`` to a peer (the coordinator's, through the I/O
        thread) or to a server address (data: sent from this thread unless another
        holds the data sockets); return a future of the reply. Non-blocking;
        thread-safe. The frames' memory must stay unchanged until the future is done.

        ``header`` is a builder's typed header (:mod:`trimtab.protocol.headers`) or a
        plain dict; this sets its ``i`` (the request id) and ``j``, and for a data
        request this worker's rank ``r`` and credential ``t``. ``held``: :meth:`flush_held`."""
        # A server's address (a data request), or None; asked once, not three times.
        address = to if isinstance(to, str) else None
        fut: concurrent.futures.Future[Reply] = (
            DataFuture(self, header.get("e"), address, header.get("c"))
            if address is not None
            else concurrent.futures.Future()
        )
        rid = next(self._rids)
        header["i"] = rid  # even for a job that is over: callers read the id back
        header["j"] = self.config.job
        if self._dead is not None:
            fut.set_exception(JobAborted(self._dead))
            return fut
        if address is not None and address in self._lost:
            chunk = cast(DataFuture, fut).chunk
            fut.set_exception(ChunkMoved(chunk, -1, self._lost[address]))
            return fut
        with self._lock:
            self._pending[rid] = fut
        if address is not None:
            plain: Header = header  # type: ignore[assignment]  # (cast() is a call)
            self._send_data(address, rid, plain, frames, held)
        else:
            control = [encode(header), *frames]
            self._failover.sent(rid, control, header["o"])
            self._outbox.append((to, control))
            self._transport.wake()
        return fut

    # -- the I/O thread ------------------------------------------------------------

    def _io_loop(self) -> None:
        try:
            while self._running:
                while self._outbox and not self._failover.away:
                    to, frames = self._outbox.popleft()
                    peer = self._transport.connect(to) if isinstance(to, str) else to
                    self._transport.send(peer, frames)
                if self._heartbeat.due():
                    # A worker between steps (at a barrier, say) sends no REPORT: its
                    # heartbeat's floor still lets a drained server retire.
                    floor = self.routing_floor() if self.map_epoch else None
                    sent = None if self.trace is None else self.trace.now()
                    beat = headers.worker_heartbeat(job=self.config.job, floor=floor, sent=sent)
                    self._transport.send(self._coord, [encode(beat)])
                env = self._transport.recv(self.config.heartbeat_s)
                if env is None:
                    gone = self._failover.check(
                        self.credential, self.rank, self.routing_floor, self._closing
                    )
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
        """Take a message read off the data sockets or the control socket: complete the
        future it answers, take its credit, or act on the coordinator's news. Never
        raises for what a peer sent (an undecodable message is dropped, and said)."""
        try:
            header = decode(frames[0], self.config.job)
        except ProtocolError as exc:
            log.error("dropped an undecodable message from %r: %s", peer, exc)
            return
        op = header["o"]
        if peer != self._coord:  # a server's: the data path's every message, first
            rid = header["i"]
            if op == Control.HEARTBEAT:
                return self._heartbeat.echoed(header, self.trace)  # (as the coordinator's)
            if rid in self._held.batches:  # a BATCH's reply
                for part in self._held.answered(header, frames, self._pending, self._lock):
                    self._on_message(peer, part)
                return
            gate = self.credit
            if gate is not None:
                server = self._servers.get(peer)
                if server is None:  # (kept: a slice and a decode per message otherwise)
                    server = self._servers[peer] = peer[2:].decode()
                # (get and pop, not [] and del: a FAILOVER read by the I/O thread may
                # take the same id meanwhile)
                uncredited = self._uncredited
                if op == Data.CREDIT:
                    if rid in uncredited and uncredited.get(rid) == server:
                        uncredited.pop(rid, None)
                    self._data_out.extend(gate.credit(server, rid))
                    return
                if rid in uncredited and uncredited.get(rid) == server:
                    # A reply to a push not yet credited (an error, say): it credits it.
                    # (Usually its CREDIT came first: the gate has nothing to do.)
                    uncredited.pop(rid, None)
                    self._data_out.extend(gate.credit(server, rid))
                self._owed.discard(rid)
                if header.get("ak"):  # a value the server counts against its window: read
                    self._data_out.append((server, [self._credit_frame(rid)]))
            with self._lock:
                fut = self._pending.pop(rid, None)
            if fut is None:
                log.warning("reply to unknown request %s (op %s)", rid, op)
            elif op == Data.VALUE and type(fut) is DataFuture and "b" not in header:
                # complete()'s usual case, inlined: a value, its frames as they came.
                # (_finish is set_result's body; the Reply made as _reply makes it)
                fut._finish(_reply((header, frames[1:], time.perf_counter())), None)
            else:
                complete(fut, header, frames)
            return
        usual, again = self._failover.take(header, self.credential)
        held = {id(m) for _, m in self._outbox}  # (those go as they are)
        self._outbox.extendleft((self._coord, m) for m in reversed(again) if id(m) not in held)
        if op == Control.ERROR and self._failover.away:
            return self._fail(f"the new coordinator refused us: {header.get('msg')}")
        if not usual:
            return None
        if op in (Control.ABORT, Control.SHUTDOWN):
            self._fail(str(header.get("why", "the job was shut down")))
            return
        if op == Control.HEARTBEAT:
            return self._heartbeat.echoed(header, self.trace)  # a clock sample, if traced
        if op == Control.FAILOVER:
            self._server_lost(header)
            return
        if op == Control.MAP_NEWS:
            self.map_news.keep(header)
            return
        with self._lock:
            fut = self._pending.pop(header["i"], None)
        self._failover.answered(header["i"], op)
        if fut is None:
            log.warning("reply to unknown request %s (op %s)", header["i"], op)
            return
        complete(fut, header, frames)

    def _server_lost(self, header: Header) -> None:
        """A FAILOVER: a server died. Every request it left unanswered fails as moved
        (its chunk's owner is in the failover map), so that its waiter fetches that map
        and resends it to the new owner; so does any request routed to it from now on.
        Never blocks (beyond a short lock)."""
        try:
            notice = read_failover_notice(header)
        except ProtocolError as exc:
            log.error("dropped a malformed FAILOVER: %s", exc)
            return
        address, epoch = str(notice["dead"]), notice["e"]
        if self.credit is not None:
            self.credit.forget(address)
        with self._lock:
            self._lost[address] = epoch
            lost = [r for r, f in self._pending.items() if getattr(f, "address", "") == address]
            futures = [cast(DataFuture, self._pending.pop(rid)) for rid in lost]
            self._owed.difference_update(lost)
            for rid in lost:
                self._uncredited.pop(rid, None)
        log.warning("server %s is lost: %d requests go to the new owners (map %d)",
                    address, len(futures), epoch)  # fmt: skip
        for f in futures:
            if not f.done():
                f.set_exception(ChunkMoved(f.chunk, -1, epoch))

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
