"""The server role: owns chunks (value, optimizer state, version), aggregates pushed
gradients in place, applies the optimizer, and pushes each updated chunk back to every
worker that contributed (no pull request needed).

This module is the event loop and the data plane: it receives, orders pushes by
priority, dispatches data messages, hands control messages to the control plane
(:mod:`.control`), and sends what the chunk store (:mod:`.store`) and the handover
(:mod:`.handover`) return. Load is counted in one :class:`LoadMeter`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trimtab.errors import ChunkMoved, JobAborted, ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import (
    Data,
    ErrorCode,
    Header,
    decode,
    error_of,
)
from trimtab.roles.server import checkpoint
from trimtab.roles.server.batches import Batches
from trimtab.roles.server.config import ServerConfig
from trimtab.roles.server.control import ControlPlane
from trimtab.roles.server.coordlink import LOAD_REPORT_S, CoordinatorLink
from trimtab.roles.server.dump import describe, stats
from trimtab.roles.server.growing import totals
from trimtab.roles.server.handover import Handover
from trimtab.roles.server.joining import Joining
from trimtab.roles.server.lifecycle import ServerState
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.optim import warm_up
from trimtab.roles.server.priority import Queued, order
from trimtab.roles.server.receipt import Receipts
from trimtab.roles.server.replica import Replicas
from trimtab.roles.server.replica_link import ReplicaLink
from trimtab.roles.server.slots import SharedArenas
from trimtab.roles.server.state import load_state, state_reply
from trimtab.roles.server.steady import SteadyPush
from trimtab.roles.server.store import ChunkStore, Reply, mean_of
from trimtab.runtime.credentials import Credentials, join_ticket
from trimtab.runtime.diagnostics import add_state_dump
from trimtab.runtime.loop import NodeLoop
from trimtab.runtime.trace import Trace
from trimtab.transport import Envelope, Peer, Transport, ZmqTransport

log = logging.getLogger("trimtab.server")

#: At most this many messages received together are handled as one burst: its pushes
#: ordered by priority (:func:`order`), its CREDITs answered before any is handled.
PRIORITY_WINDOW = 256

#: Seconds between the loop's bookkeeping (heartbeat and load report due, the
#: coordinator's liveness, checkpoint files written) while bursts keep coming: a
#: turn that received nothing, or a transport that saw a connection close, runs it
#: at once. Its clocks are in tenths of a second and more; a turn is tens of us.
BOOKKEEPING_S = 0.002

#: The data ops a worker sends a server; each must carry the worker's credential.
_WORKER_OPS = frozenset(
    {Data.PUSH, Data.PULL, Data.INIT, Data.STATS, Data.STATE_GET, Data.STATE_SET}
)
_PUSH = int(Data.PUSH)


def server_transport(config: ServerConfig) -> Transport:
    """The transport a :class:`Server` makes when given none: ZeroMQ, bound where
    ``config`` says. For a launcher that wraps it (fault injection). Does not block."""
    return ZmqTransport(
        bind=True, host=config.host, port=config.port, max_frame_bytes=config.max_frame_bytes
    )


class Server(ControlPlane):
    """A parameter server. ``run()`` blocks until the job ends.

    Construct, then call :meth:`run` in the process's main thread (``trimtab server``)
    or :meth:`start` for a background thread in tests. Never raises for a bad message:
    it answers ERROR and goes on. :meth:`run` raises :class:`JobAborted` if the job was
    aborted or the coordinator went silent.

    A slow server is emulated around it, not in it: ``config.stragglers`` is not read
    here; wrap the transport in :class:`trimtab.faults.throttle.ThrottledTransport`
    (``trimtab server`` does, when ``--straggler`` names servers).
    """

    def __init__(self, config: ServerConfig, transport: Transport | None = None) -> None:
        self.config = config
        self._transport = transport or server_transport(config)
        self._transport.spin_s = config.spin_s
        self._loop = NodeLoop(config.job, self._transport, log)
        self.state = ServerState.JOINING
        self.meter = LoadMeter()
        self._link = CoordinatorLink(config, self._transport, self._loop, self.meter, self._rejoin)
        self._coord = self._link.peer
        self._arenas = SharedArenas(config.job)
        self._store = ChunkStore(self.meter, self._arenas)
        self._link.growing = lambda: totals(self._store.chunks.values())
        self._credentials = Credentials(config.job)
        self._receipts = Receipts(
            self._loop,
            self.meter,
            ordered=config.priority,
            synchronous=lambda: self._store.consistency.synchronous,
        )
        self._handover = Handover(self._store, self._credentials, config.shared_memory)
        self._joining = Joining()
        self._replicas = ReplicaLink(
            Replicas(self._store, self._credentials, config.shared_memory),
            self._loop,
            self._transport.connect,
            self._coord,
            lambda peer, rid, chunk, k: self._receipts.value(
                peer, rid, chunk, chunk.value, k, None
            ),
            self._halt,
        )
        #: The steady state's pushes (dense, BSP, nothing moving): served in one pass.
        self._steady = SteadyPush(
            self._store,
            self._credentials,
            self._receipts,
            self._replicas.replicas,
            self._transport.through_lane,
        )
        self._batches = Batches(self._loop)
        self._checkpoints = checkpoint.ServerCheckpoints(self._store, self._loop, self._coord)
        # What one turn of the loop takes: a burst, ordered, or one message at a time.
        self._window = PRIORITY_WINDOW if config.priority else 1
        self._stop = False
        self._abort: str | None = None
        self.trace: Trace | None = None  # --trace: set before run(), which hands it on
        #: Called once, on the loop's thread, when the coordinator registered it (its
        #: state turns SERVING, after its warm-up): set before run(). ``trimtab server``
        #: restores a late server's priority there (:mod:`trimtab.launch.niceness`).
        self.on_serving: Callable[[], None] | None = None

    @property
    def address(self) -> str:
        """Where workers reach this server."""
        return self._transport.address

    @property
    def index(self) -> int:
        """This server's index in the job, -1 until it registered. Never blocks."""
        return self._store.index

    @property
    def step(self) -> int:
        """The highest clock it completed on a chunk (or the job's, if higher). Never blocks."""
        return self.meter.step

    @property
    def moved_in(self) -> int:
        """Chunks handed to this server."""
        return self._handover.moved_in

    @property
    def moved_out(self) -> int:
        """Chunks this server handed over, acknowledged by their new owner."""
        return self._handover.moved_out

    def stalled(self, seconds: float) -> None:
        """Count ``seconds`` its transport spent pacing traffic (a throttled link) as busy,
        so the load report sees a slow link as a slow server. Loop thread; never blocks."""
        self.meter.stalled(seconds)

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread; returns the thread."""
        thread = threading.Thread(target=self._run_logged, name="trimtab-server", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Ask the loop to finish. Thread-safe; does not wait."""
        self._stop = True
        self._transport.wake()

    def _run_logged(self) -> None:
        try:
            self.run()
        except JobAborted as exc:
            log.warning("%s", exc)

    def run(self) -> None:
        """Serve until SHUTDOWN. Blocks. Raises :class:`JobAborted` on ABORT or silence."""
        torch.set_grad_enabled(False)  # (this thread's setting) nothing here needs autograd
        self._store.trace = self._receipts.trace = self._link.trace = self.trace
        forget_state_dump = add_state_dump(self.describe)
        key = self.config.server_key
        ticket = join_ticket(key, self.config.job) if key else None
        self._loop.send(
            self._coord, headers.register_server(rid=1, addr=self.address, ticket=ticket)
        )
        # Warmed up beside the loop, after REGISTER: the job is placed meanwhile (its
        # workers import and warm up too), and the loop heartbeats until its first
        # message, which waits for the warm-up: the one-time cost still falls before
        # any step, not in one. A job starts about 1 s sooner.
        thread = threading.Thread(target=warm_up, name="trimtab-warm-up", daemon=True)
        thread.start()
        warming: threading.Thread | None = thread
        # Peers whose connection closed, not yet taken (None: ask every turn).
        lost = self._transport.pending_lost
        due = 0.0  # when the bookkeeping runs next, while bursts keep coming
        try:
            while not self._stop:
                burst = self._transport.recv_burst(
                    min(self.config.heartbeat_s, LOAD_REPORT_S), self._window
                )
                if burst:
                    if warming is not None:
                        self._warmed(warming)
                        warming = None
                    for peer, frames, header in self._batch(burst):
                        if self._stop:
                            break
                        self._serve(peer, frames, header)
                    now = time.monotonic()
                    if now < due and lost is not None and not lost and not self._stop:
                        continue  # (nothing closed, nothing due: the next burst)
                    due = now + BOOKKEEPING_S
                # After what came (a SHUTDOWN before its sender's connection closed ends
                # the job, not a wait for a replacement coordinator).
                gone = None if self._stop else self._link.tick(self.state is ServerState.SERVING)
                if gone is not None:
                    self._abort = gone
                    break
                self._checkpoints.poll()  # files written by its thread: say so
        finally:
            forget_state_dump()
            self._checkpoints.close()
            self.state = ServerState.STOPPED
            self._arenas.close()
            self._transport.close()
        if self._abort is not None:
            raise JobAborted(f"server {self.index}: {self._abort}")

    def _batch(self, burst: Sequence[Envelope]) -> list[Queued]:
        """Messages received together, as the loop handles them: each decoded once, the
        CREDITs sent and consumed (:meth:`Receipts.acknowledge`), the rest in P3's order
        (:func:`order`; a burst is one message without priority). Loop thread; blocks
        only as a send does."""
        batch = self._receipts.acknowledge(burst, self._coord)
        return order(batch) if len(batch) > 1 else batch

    def _serve(self, peer: Peer, frames: list[memoryview], header: Header | None) -> None:
        """Handle one message, from the coordinator or a data peer."""
        if peer == self._coord:
            self._link.heartbeat.heard()
            self._on_control(frames)
            return
        if self.state is ServerState.JOINING and self._joining.hold(peer, frames, header):
            return  # (served once REGISTERED gives the key its credentials are checked by)
        started = time.perf_counter()
        self._on_data(peer, frames, header)
        self.meter.served(time.perf_counter() - started, sum(map(len, frames)))

    def _warmed(self, warming: threading.Thread) -> None:
        """Wait for the warm-up thread, heartbeating meanwhile. Blocks."""
        while warming.is_alive():
            warming.join(0.1)
            self._link.beat()

    # -- data plane ----------------------------------------------------------------

    def _on_data(self, peer: Peer, frames: list[memoryview], header: Header | None = None) -> None:
        rid = 0
        try:
            if header is None:
                header = decode(frames[0], self.config.job)
            rid = header["i"]
            op = header["o"]
            if op == _PUSH and self._steady.push(peer, frames, header):
                return  # (any other push, and one that fails a check: the general path)
            if op in (Data.ACK, Data.ERROR):
                if self._replicas.answer(peer, op, rid, header):
                    return
                handed = self._handover.handed(rid, peer)
                if handed is not None:
                    if op == Data.ERROR:  # the new owner refused: nothing can fix that here
                        self._abort = f"handover of chunk {handed} refused: {header}"
                        self._stop = True
                        return
                    self._handover.acked(handed)
                    self._loop.send(
                        self._coord, headers.handed(epoch=self._store.epoch, chunks=[handed])
                    )
                    return
                log.debug("dropped an ACK or ERROR that answers nothing of ours")
                return  # (an answer to it could start an exchange of errors)
            if op == Data.HANDOVER:
                self._take_handover(peer, frames, header)
                return
            if op == Data.REPLICATE:
                self._replicas.take(peer, frames, header, self._credentials.server(header))
                return
            if op == Data.BATCH:  # row requests for several chunks: each served alone
                rank = self._credentials.worker(header)
                parts = self._batches.open(peer, rank, header, frames[1:], self._credentials.worker)
                for part, sub in parts:
                    self._on_data(peer, part, sub)
                return
            if op not in _WORKER_OPS:
                raise ProtocolError(
                    ErrorCode.UNKNOWN_OP.value, f"op {op} is not a data op a server answers"
                )
            rank = self._credentials.worker(header)
            # A peek, before the op's reader: is it for a chunk on its way here? Any
            # request may carry anything; its reader judges it once it is handled.
            cid = header.get("c")
            if (
                self._store.moves  # (empty but while placement changes: one check a push)
                and isinstance(cid, int)
                and self._handover.is_arriving(cid)
            ):
                sent_by = header.get("e")
                if isinstance(sent_by, int) and sent_by < self._store.epoch:
                    # Routed by a map older than the one moving the chunk here: for its
                    # clock the chunk may still be its old owner's, which hands it over
                    # only once that round is complete, this request's push included.
                    # Held here, both would wait forever; with this map the worker
                    # sends it where it belongs (here again, if the clock is past the cut).
                    raise ChunkMoved(cid, self.index, self._store.epoch)
                # The chunk is on its way here: answer once it arrived.
                self._handover.queue(cid, peer, frames)
                return
            if op == Data.PUSH:
                if self._replicas.resent(peer, header, self._store.chunks):
                    return
                replies = self._store.push(
                    peer, header, frames[1:], self._transport.through_lane(peer)
                )
                if replies:  # sent once the chunk's backup (if any) holds the round
                    self._replicas.after_rounds(replies, self._answer)
            elif op == Data.PULL:
                pull = headers.read_pull(header)
                chunk = self._store.owned(pull["c"])
                if "sr" in pull:  # rows of a table
                    self._receipts.reply(self._store.pull_rows(peer, rid, pull, frames[1:]))
                elif "gm" in pull:
                    mean = mean_of(chunk, pull["gm"])
                    self._receipts.value(peer, rid, chunk, mean, pull["gm"], None)
                else:
                    self._receipts.value(peer, rid, chunk, chunk.value, chunk.round, None)
            elif op == Data.INIT:
                adoption = self._credentials.adoption(header, rank) if "ad" in header else None
                self._store.init(header, frames[1:], rank, adoption)
                self._replicas.ack_after(header["c"], peer, rid)
            elif op == Data.STATE_GET:
                reply, state_frames = state_reply(self._store, header)
                self._loop.send(peer, reply, state_frames)
            elif op == Data.STATE_SET:
                load_state(self._store, header, frames[1:])
                self._replicas.ack_after(header["c"], peer, rid)
            else:  # STATS
                self._loop.send(peer, headers.stats_reply(rid=rid, stats=self.stats()))
        except ChunkMoved as gone:
            self._loop.send(
                peer, headers.moved(rid=rid, chunk=gone.chunk, owner=gone.owner, epoch=gone.epoch)
            )
        except ProtocolError as exc:
            code, msg = error_of(exc)
            self._loop.refuse(peer, rid, code, msg, data=True)
        except Exception as exc:  # never let one request take the server down
            log.exception("internal error on a request")
            self._loop.refuse(
                peer, rid, ErrorCode.INTERNAL.value, f"{type(exc).__name__}: {exc}", data=True
            )

    def _answer(self, replies: Sequence[Reply]) -> None:
        """Send a completed round's replies (VALUEs); hand the chunk over if it leaves."""
        for r in replies:
            self._receipts.reply(r)
        if replies and self._store.moves:
            # A leaving chunk goes once its last round is answered: only a push that got
            # replies out (its own among them) can have made it ready.
            self._hand_over(replies[0].chunk.spec.id)

    def _halt(self, why: str) -> None:
        """Stop serving and end :meth:`run` with :class:`JobAborted` saying ``why``."""
        self._abort = why
        self._stop = True

    def _take_handover(self, peer: Peer, frames: list[memoryview], header: Header) -> None:
        """A HANDOVER from another server (its credential checked first). Raises
        :class:`ProtocolError` as :meth:`Handover.arrive` and :meth:`Handover.hold_early`,
        FORBIDDEN from anyone but a server of the job."""
        sender = self._credentials.server(header)
        if headers.read_handover(header)["e"] > self._store.epoch:
            # The old owner learned of the new map before we did: wait for it.
            self._handover.hold_early(peer, frames)
            return
        queued = self._handover.arrive(header, frames[1:], sender)  # (reads it again: rare)
        self._loop.send(peer, headers.ack(rid=header["i"]))
        for qpeer, qframes in queued:
            self._on_data(qpeer, qframes)

    def describe(self) -> str:
        """Its protocol state for a hung job's dump (:data:`STACK_SIGNAL`): see
        :func:`~trimtab.roles.server.dump.describe`. Only reads; never blocks."""
        return describe(self.index, self.state.value, self.meter.step, self._store, self._handover)

    def stats(self) -> dict[str, Any]:
        """Counters and versions, for tests and the coordinator (see
        :func:`~trimtab.roles.server.dump.stats`). Loop thread only."""
        out = stats(self.index, self._store, self._replicas.replicas, self._handover,
                    self.meter, self._loop.errors_sent)  # fmt: skip
        out["batches"], out["batch_parts"] = self._batches.opened, self._batches.parts
        return out
