"""The server role: owns chunks (value, optimizer state, version), aggregates pushed
gradients in place, applies the optimizer, and pushes each updated chunk back to every
worker that contributed (no pull request needed)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec, TensorSpec, make_chunks
from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import JobAborted, ProtocolError
from trimtab.faults.stragglers import ServerStraggler
from trimtab.policies.consistency import CONSISTENCY, ConsistencyPolicy, PushInfo
from trimtab.protocol.messages import (
    Control,
    Data,
    ErrorCode,
    Header,
    decode,
    error_of,
    field,
    inline,
    payload_frames,
)
from trimtab.roles.server.config import ServerConfig
from trimtab.roles.server.optim import ChunkOptimizer, OptimizerMode, hyperparameters, warm_up
from trimtab.runtime.diagnostics import add_state_dump
from trimtab.runtime.loop import Heartbeat, NodeLoop
from trimtab.runtime.tensors import (
    TORCH_DTYPES,
    WIRE_DTYPES,
    as_bytes,
    check_tensor_frames,
    tensor_from,
)
from trimtab.transport import Envelope, Peer, Transport, ZmqTransport
from trimtab.transport.shm import Arena, job_prefix

log = logging.getLogger("trimtab.server")

#: Seconds between load reports (busy time, bytes) to the coordinator, for PSLD.
LOAD_REPORT_S = 0.25

#: At most this many queued messages are looked at at once to order pushes by priority.
PRIORITY_WINDOW = 256


class ServerState(enum.Enum):
    """A server's lifecycle. Legal transitions:
    JOINING -> SERVING (registered) -> STOPPED (shutdown or abort)."""

    JOINING = "joining"
    SERVING = "serving"
    STOPPED = "stopped"


class _Chunk:
    """A chunk this server owns, with its aggregation state for the current round."""

    def __init__(self, spec: ChunkSpec, opt: tuple[str, dict[str, Any]] | None) -> None:
        self.spec = spec
        dtype = TORCH_DTYPES[spec.dtype]
        self.value = torch.zeros(spec.numel, dtype=dtype)
        # Half-precision gradients are summed in float32, as torch's AMP would.
        merge_dtype = torch.float32 if spec.dtype in ("float16", "bfloat16") else dtype
        self.merge = torch.empty(spec.numel, dtype=merge_dtype)
        # Byte views of both buffers, made once: replies send them without copying
        # (both are only ever updated in place).
        self.value_bytes = as_bytes(self.value)
        self.merge_bytes = as_bytes(self.merge)
        self.optimizer = ChunkOptimizer(opt[0], self.value, opt[1]) if opt else None
        self.version = 0
        self.round = 0
        self.weight_sum = 0.0
        self.scale = 0.0  # what each arrival of this round is divided by as it is merged
        self.last_sum = 0.0  # the previous round's sum of weights (synchronous modes)
        self.any_grad = False
        self.arrived: set[int] = set()
        self.waiting: list[_Waiter] = []
        self.held: list[_Waiter] = []  # replies the consistency policy holds back
        self.last_clock: dict[int, int] = {}
        self.last_weight: dict[int, float] = {}
        self.pushes = 0
        self.dropped = 0
        self.discounted = 0


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where a push's gradient was, in a worker's shared memory (see ``_shm``)."""

    arena: Arena
    offset: int
    capacity: int


@dataclasses.dataclass
class _Waiter:
    """A push waiting for its reply."""

    peer: Peer
    rid: int
    rank: int
    clock_after: int
    value: torch.Tensor | None = None
    slot: _Slot | None = None  # the push's shared-memory slot: the reply's value goes there


class Server:
    """A parameter server. ``run()`` blocks until the job ends.

    Construct, then call :meth:`run` in the process's main thread (``trimtab server``)
    or :meth:`start` for a background thread in tests. Never raises for a bad message:
    it answers ERROR and goes on. :meth:`run` raises :class:`JobAborted` if the job was
    aborted or the coordinator went silent.
    """

    def __init__(self, config: ServerConfig, transport: Transport | None = None) -> None:
        self.config = config
        self._transport = transport or ZmqTransport(
            bind=True, host=config.host, port=config.port, max_frame_bytes=config.max_frame_bytes
        )
        self._transport.spin_s = config.spin_s
        self._loop = NodeLoop(config.job, self._transport, log)
        self.state = ServerState.JOINING
        self.index = -1
        self._coord = self._transport.connect(config.coordinator)
        self._heartbeat = Heartbeat(config.heartbeat_s, config.coordinator_timeout_s)
        self._chunks: dict[int, _Chunk] = {}
        self._owners: tuple[int, ...] = ()
        self._epoch = 0
        self._workers: set[int] = set()
        self._mode = OptimizerMode.SERVER
        self._consistency: ConsistencyPolicy = CONSISTENCY.create("bsp")
        self._stop = False
        self._abort: str | None = None
        self._tensors: list[TensorSpec] = []
        self._specs: list[ChunkSpec] = []
        self._opt: dict[str, Any] = {}
        # Migration: chunks leaving (id -> (cut clock, new owner)), chunks arriving (id ->
        # requests that came before the chunk did), handovers sent and not yet acked.
        self._outgoing: dict[int, tuple[int, int]] = {}
        self._incoming: dict[int, list[tuple[Peer, list[memoryview]]]] = {}
        self._handing: dict[int, int] = {}  # request id -> chunk id
        self._handover_rids = 0
        self._early: list[tuple[Peer, list[memoryview]]] = []
        self._servers: tuple[str, ...] = ()
        self._straggler = ServerStraggler(config.stragglers, -1)
        self._step = 0
        self._busy_s = 0.0
        self._bytes = 0
        self._arenas: dict[str, Arena] = {}  # workers' shared memory, mapped on first use
        self._shared_pushes = 0  # pushes whose gradient came through shared memory
        self._lane_pushes = 0  # pushes that came over the transport's local lane
        self._requests = 0
        self._load_due = 0.0
        self.moved_in = 0
        self.moved_out = 0

    @property
    def address(self) -> str:
        """Where workers reach this server."""
        return self._transport.address

    def start(self) -> Any:
        """Run the loop in a daemon thread; returns the thread."""
        import threading

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
        warm_up()
        forget_state_dump = add_state_dump(self.describe)
        self._loop.send(
            self._coord,
            {"o": int(Control.REGISTER), "i": 1, "role": "server", "addr": self.address},
        )
        try:
            while not self._stop:
                env = self._transport.recv(min(self.config.heartbeat_s, LOAD_REPORT_S))
                if self._heartbeat.due():
                    self._loop.send(self._coord, self._heartbeat.header())
                if self.state is ServerState.SERVING and time.monotonic() >= self._load_due:
                    self._report_load()
                if env is None:
                    if self._heartbeat.silent_for() > self.config.coordinator_timeout_s:
                        self._abort = f"coordinator silent for {self._heartbeat.silent_for():.0f}s"
                        break
                    continue
                for peer, frames, header in self._by_priority(env):
                    if self._stop:
                        break
                    self._serve(peer, frames, header)
        finally:
            forget_state_dump()
            self.state = ServerState.STOPPED
            self._straggler.close()
            for arena in self._arenas.values():
                arena.close()
            self._transport.close()
        if self._abort is not None:
            raise JobAborted(f"server {self.index}: {self._abort}")

    def _by_priority(self, first: Envelope) -> list[tuple[Peer, list[memoryview], Header | None]]:
        """``first`` and the messages queued behind it (up to :data:`PRIORITY_WINDOW`),
        each with its header when it is a push. Each run of consecutive pushes is sorted
        by chunk id (stable: one chunk's pushes keep their order); every other message
        keeps its place, so nothing is reordered around a control or migration message.
        Non-blocking."""
        batch = [first]
        if self.config.priority:
            # What the transport holds already (it receives in bursts), then, behind a
            # burst, what more is queued: a lone request is not charged another poll.
            while len(batch) < PRIORITY_WINDOW:
                env = self._transport.recv_queued()
                if env is None and len(batch) > 1:
                    env = self._transport.recv(0)
                if env is None:
                    break
                batch.append(env)
        if len(batch) == 1:
            return [(first.peer, first.frames, None)]
        out: list[tuple[Peer, list[memoryview], Header | None]] = []
        run: list[tuple[Peer, list[memoryview], Header | None]] = []
        for env in batch:
            header = None
            if env.peer != self._coord:
                with contextlib.suppress(Exception):  # undecodable: answered in order
                    header = decode(env.frames[0], self.config.job)
            if (
                header is not None
                and header.get("o") == Data.PUSH
                and isinstance(header.get("c"), int)
            ):
                run.append((env.peer, env.frames, header))
                continue
            out.extend(sorted(run, key=lambda m: m[2]["c"]))  # type: ignore[index]
            run = []
            out.append((env.peer, env.frames, header))
        out.extend(sorted(run, key=lambda m: m[2]["c"]))  # type: ignore[index]
        return out

    def _serve(self, peer: Peer, frames: list[memoryview], header: Header | None) -> None:
        """Handle one message, from the coordinator or a data peer."""
        if peer == self._coord:
            self._heartbeat.heard()
            self._on_control(frames)
            return
        started = time.perf_counter()
        nbytes = sum(len(f) for f in frames)
        if self._straggler:
            self._straggler.on_bytes(nbytes, self._step)
        self._on_data(peer, frames, header)
        self._busy_s += time.perf_counter() - started
        self._bytes += nbytes
        self._requests += 1

    # -- control plane -------------------------------------------------------------

    def _on_control(self, frames: list[memoryview]) -> None:
        try:
            header = decode(frames[0], self.config.job)
        except ProtocolError as exc:
            log.error("undecodable message from the coordinator: %s", exc)
            return
        op = header["o"]
        if op == Control.REGISTERED:
            self.index = header["rank"]
            self.state = ServerState.SERVING
            self._straggler = ServerStraggler(self.config.stragglers, self.index)
            log.info("server %d serving at %s", self.index, self.address)
        elif op == Control.MAP:
            self._apply_map(header)
            self._loop.send(
                self._coord, {"o": int(Control.MAP_ACK), "i": header["i"], "epoch": self._epoch}
            )
        elif op == Control.MIGRATE:
            cuts = self._apply_migrate(header)
            self._loop.send(
                self._coord,
                {"o": int(Control.MIGRATE_ACK), "i": 0, "epoch": self._epoch, "cuts": cuts},
            )
            for cid in list(self._outgoing):
                self._maybe_hand_over(cid)
            early, self._early = self._early, []
            for peer, frames in early:
                self._on_data(peer, frames)
        elif op == Control.OK and isinstance(header.get("k"), int):
            if header["k"] > self._step:  # the job's clock, for a server with little to do
                self._step = header["k"]
                if self._straggler:
                    self._straggler.on_step(self._step)
        elif op == Control.SHUTDOWN:
            log.info("server %d: job finished, shutting down", self.index)
            self._stop = True
        elif op == Control.ABORT:
            self._abort = str(header.get("why", "job aborted"))
            self._stop = True
        elif op == Control.ERROR:
            self._abort = f"coordinator refused us: {header.get('msg')}"
            self._stop = True

    def _learn_job(self, header: Header) -> None:
        """What every map carries about the job: tensors, optimizer, workers, mode."""
        self._tensors = [TensorSpec.from_wire(t) for t in header["tensors"]]
        self._specs = make_chunks(self._tensors, header["chunk_bytes"])
        self._workers = set(header["workers"])
        self._servers = tuple(header["servers"])
        self._consistency = CONSISTENCY.create(
            header.get("consistency", "bsp"),
            workers=len(self._workers),
            **header.get("consistency_args", {}),
        )
        self._opt = header["opt"]
        self._mode = OptimizerMode(self._opt["mode"])

    def _new_chunk(self, spec: ChunkSpec) -> _Chunk:
        hp = self._opt["groups"][self._tensors[spec.tensor].group]
        server_opt = (self._opt["cls"], hp) if self._mode is OptimizerMode.SERVER else None
        return _Chunk(spec, server_opt)

    def _apply_map(self, header: Header) -> None:
        self._learn_job(header)
        self._owners = tuple(header["owners"])
        self._epoch = header["epoch"]
        self._chunks = {
            spec.id: self._new_chunk(spec)
            for spec in self._specs
            if self._owners[spec.id] == self.index
        }
        log.info(
            "server %d owns %d of %d chunks (epoch %d, %s mode)",
            self.index,
            len(self._chunks),
            len(self._specs),
            self._epoch,
            self._mode.value,
        )

    # -- migration -----------------------------------------------------------------

    def _apply_migrate(self, header: Header) -> dict[str, int]:
        """Take a new map: decide, for each chunk leaving, the clock from which it is
        its new owner's (the round in progress if no push for it arrived yet, else the
        next), and expect the chunks arriving. Returns the cuts, by chunk id."""
        if not self._specs:
            self._learn_job(header)  # a server that joined after the job started
        self._servers = tuple(header["servers"])
        owners = tuple(header["owners"])
        cuts: dict[str, int] = {}
        for cid, chunk in self._chunks.items():
            if owners[cid] == self.index or cid in self._outgoing:
                continue
            cut = chunk.round + (1 if chunk.arrived else 0)
            self._outgoing[cid] = (cut, owners[cid])
            cuts[str(cid)] = cut
        for cid, owner in enumerate(owners):
            if owner == self.index and cid not in self._chunks:
                self._incoming.setdefault(cid, [])
        self._owners = owners
        self._epoch = header["epoch"]
        log.info(
            "server %d: map epoch %d, %d chunks leaving, %d arriving",
            self.index,
            self._epoch,
            len(cuts),
            len(self._incoming),
        )
        return cuts

    def _maybe_hand_over(self, cid: int) -> None:
        """Send a leaving chunk to its new owner once every round before its cut is
        applied and answered: value, optimizer state, version and round go together."""
        cut, owner = self._outgoing[cid]
        chunk = self._chunks.get(cid)
        if chunk is None or chunk.round < cut or chunk.arrived or chunk.waiting or chunk.held:
            return
        header: Header = {
            "o": int(Data.HANDOVER),
            "c": cid,
            "v": chunk.version,
            "k": chunk.round,
            "e": self._epoch,
            "dt": WIRE_DTYPES[chunk.value.dtype],
            "n": chunk.spec.numel,
        }
        frames: list[Any] = [as_bytes(chunk.value)]
        header["p"] = [chunk.pushes, chunk.dropped, chunk.discounted]
        if chunk.optimizer is not None:
            group = chunk.optimizer.optimizer.param_groups[0]
            header["hp"] = hyperparameters(group)
            state = chunk.optimizer.optimizer.state.get(chunk.optimizer.param, {})
            meta: dict[str, Any] = {}
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    t = value.detach().contiguous()
                    meta[key] = ["t", WIRE_DTYPES[t.dtype], list(t.shape)]
                    frames.append(as_bytes(t.view(-1)) if t.numel() else b"")
                else:
                    meta[key] = ["v", value]
            header["st"] = meta
        self._handover_rids += 1
        rid = self._handover_rids
        header["i"] = rid
        self._handing[rid] = cid
        del self._chunks[cid]  # from here on requests for it get MOVED
        self._loop.send(self._transport.connect(self._servers[owner]), header, frames)

    def _on_handover(self, peer: Peer, header: Header, frames: Sequence[memoryview]) -> None:
        cid = field(header, "c", int)
        if cid not in self._incoming:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"chunk {cid} handed to server {self.index}, which does not expect it",
            )
        spec = self._specs[cid]
        value = check_tensor_frames(header, frames[:1], spec.dtype, spec.numel)
        chunk = self._new_chunk(spec)
        chunk.value.copy_(value)
        chunk.version = field(header, "v", int)
        chunk.round = field(header, "k", int)
        chunk.pushes, chunk.dropped, chunk.discounted = (int(x) for x in field(header, "p", list))
        if chunk.optimizer is not None:
            hp = header.get("hp")
            if isinstance(hp, dict):
                chunk.optimizer.set_hparams(hp)
            state: dict[str, Any] = {}
            rest = list(frames[1:])
            for key, (kind, *info) in field(header, "st", dict).items():
                if kind == "t":
                    dtype, shape = info
                    numel = 1
                    for d in shape:
                        numel *= d
                    t = tensor_from(rest.pop(0), dtype, numel) if numel else torch.empty(0)
                    state[key] = t.clone().view(shape)
                else:
                    state[key] = info[0]
            if state:
                chunk.optimizer.optimizer.state[chunk.optimizer.param] = state
        self._chunks[cid] = chunk
        queued = self._incoming.pop(cid)
        self.moved_in += 1
        self._loop.send(peer, {"o": int(Data.ACK), "i": header["i"]})
        for qpeer, qframes in queued:
            self._on_data(qpeer, qframes)

    def _on_handed(self, rid: int) -> None:
        cid = self._handing.pop(rid)
        self._outgoing.pop(cid, None)
        self.moved_out += 1
        self._loop.send(
            self._coord, {"o": int(Control.HANDED), "i": 0, "epoch": self._epoch, "c": [cid]}
        )

    def _report_load(self) -> None:
        self._load_due = time.monotonic() + LOAD_REPORT_S
        self._loop.send(
            self._coord,
            {
                "o": int(Control.LOAD),
                "i": 0,
                "busy": self._busy_s,
                "bytes": self._bytes,
                "n": self._requests,
                "step": self._step,
            },
        )

    # -- data plane ----------------------------------------------------------------

    def _on_data(self, peer: Peer, frames: list[memoryview], header: Header | None = None) -> None:
        rid = 0
        try:
            if header is None:
                header = decode(frames[0], self.config.job)
            rid = header["i"]
            op = header["o"]
            if op in (Data.ACK, Data.ERROR) and rid in self._handing:
                if op == Data.ERROR:  # the new owner refused: nothing can fix that here
                    self._abort = f"handover of chunk {self._handing[rid]} refused: {header}"
                    self._stop = True
                    return
                self._on_handed(rid)
                return
            cid = header.get("c")
            if op != Data.HANDOVER and isinstance(cid, int) and cid in self._incoming:
                sent_by = header.get("e")
                if isinstance(sent_by, int) and sent_by < self._epoch:
                    # Routed by a map older than the one moving the chunk here: for its
                    # clock the chunk may still be its old owner's, which hands it over
                    # only once that round is complete, this request's push included.
                    # Held here, both would wait forever; with this map the worker
                    # sends it where it belongs (here again, if the clock is past the cut).
                    raise _Moved(cid, self.index, self._epoch)
                # The chunk is on its way here: answer once it arrived.
                self._incoming[cid].append((peer, frames))
                return
            if op == Data.HANDOVER and header.get("e", 0) > self._epoch:
                # The old owner learned of the new map before we did: wait for it.
                self._early.append((peer, frames))
            elif op == Data.HANDOVER:
                self._on_handover(peer, header, frames[1:])
            elif op == Data.PUSH:
                self._on_push(peer, header, frames[1:])
            elif op == Data.PULL:
                chunk = self._owned(header)
                self._send_value(peer, rid, chunk, chunk.value)
            elif op == Data.INIT:
                chunk = self._owned(header)
                value = check_tensor_frames(header, frames[1:], chunk.spec.dtype, chunk.spec.numel)
                chunk.value.copy_(value)
                self._loop.send(peer, {"o": int(Data.ACK), "i": rid})
            elif op == Data.STATS:
                self._loop.send(peer, {"o": int(Data.ACK), "i": rid, **self.stats()})
            else:
                raise ProtocolError(
                    ErrorCode.UNKNOWN_OP.value, f"op {op} is not a data op a server answers"
                )
        except _Moved as moved:
            self._loop.send(
                peer,
                {
                    "o": int(Data.MOVED),
                    "i": rid,
                    "c": moved.chunk,
                    "s": moved.owner,
                    "e": moved.epoch,
                },
            )
        except ProtocolError as exc:
            code, msg = error_of(exc)
            self._loop.refuse(peer, rid, code, msg, data=True)
        except Exception as exc:  # never let one request take the server down
            log.exception("internal error on a request")
            self._loop.refuse(peer, rid, "internal", f"{type(exc).__name__}: {exc}", data=True)

    def _owned(self, header: Header) -> _Chunk:
        cid = field(header, "c", int)
        chunk = self._chunks.get(cid)
        if chunk is not None:
            return chunk
        if 0 <= cid < len(self._owners):
            raise _Moved(cid, self._owners[cid], self._epoch)
        raise ProtocolError(
            ErrorCode.UNKNOWN_CHUNK.value,
            f"no chunk {cid} in this job ({len(self._owners)} chunks at epoch {self._epoch})",
        )

    def _on_push(self, peer: Peer, header: Header, frames: Sequence[memoryview]) -> None:
        frames = payload_frames(header, frames)
        chunk = self._owned(header)
        slot = None
        if "sm" in header:
            slot, frames = self._shared(header, frames)
        rank = field(header, "r", int)
        clock = field(header, "k", int)
        leaving = self._outgoing.get(chunk.spec.id)
        if leaving is not None and clock >= leaving[0]:
            raise _Moved(chunk.spec.id, leaving[1], self._epoch)
        weight = field(header, "w", (int, float))
        read = header.get("v", chunk.version)
        if rank not in self._workers:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"worker {rank} is not in this job")
        if not isinstance(read, int) or isinstance(read, bool) or weight <= 0:
            raise ProtocolError(ErrorCode.MALFORMED.value, "'v' must be an int, 'w' positive")
        info = PushInfo(rank, clock, float(weight), read, chunk.version)
        why = self._consistency.check(info, chunk.round, chunk.last_clock.get(rank))
        if why is not None:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"chunk {chunk.spec.id}: {why}")
        if rank in chunk.arrived:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"worker {rank} already pushed chunk {chunk.spec.id} for clock {clock}",
            )
        grad = None
        if not header.get("z", False):
            grad = check_tensor_frames(
                header, frames, chunk.spec.dtype, chunk.spec.numel, compressed=True
            )
        hp = header.get("hp")
        if hp is not None and not isinstance(hp, dict):
            raise ProtocolError(ErrorCode.MALFORMED.value, "'hp' must be a map")
        # Everything is validated: from here on the chunk's state changes.
        if hp and chunk.optimizer is not None:
            chunk.optimizer.set_hparams(hp)
        discount = self._consistency.discount(info)
        chunk.pushes += 1
        self._shared_pushes += slot is not None
        self._lane_pushes += self._transport.through_lane(peer)
        if discount is None:
            chunk.dropped += 1
        else:
            if discount < 1.0:
                chunk.discounted += 1
            w = float(weight) * discount
            if self._consistency.synchronous:
                chunk.weight_sum += float(weight)
                if not chunk.any_grad and chunk.scale <= 0:
                    # The round's divisor, predicted as last round's sum of weights (or
                    # this weight times the workers), so that each arrival is scaled as
                    # it is merged rather than the sum divided in a pass of its own;
                    # _update corrects the rare round whose weights changed.
                    chunk.scale = chunk.last_sum or float(weight) * len(self._workers)
            else:
                # Each push is an update of its own: it counts its worker's share of the
                # global batch (b_i / sum of the latest b_j), so N pushes move the model
                # as far as one synchronous step would.
                chunk.last_weight[rank] = float(weight)
                chunk.weight_sum = sum(
                    chunk.last_weight.get(r, float(weight)) for r in self._workers
                )
                chunk.scale = chunk.weight_sum
            if grad is not None:
                alpha = w / chunk.scale
                if chunk.any_grad:
                    chunk.merge.add_(grad, alpha=alpha)  # (a compressed one in float32)
                elif grad.dtype == chunk.merge.dtype:
                    torch.mul(grad, alpha, out=chunk.merge)  # first arrival: copy, scaled
                    chunk.any_grad = True
                else:  # compressed: widen first, so the scaling is not rounded to fp16
                    chunk.merge.copy_(grad).mul_(alpha)
                    chunk.any_grad = True
        chunk.arrived.add(rank)
        chunk.last_clock[rank] = clock
        chunk.waiting.append(_Waiter(peer, header["i"], rank, clock + 1, slot=slot))
        if self._consistency.ready(chunk.arrived, self._workers):
            self._update(chunk)

    def _update(self, chunk: _Chunk) -> None:
        result: torch.Tensor | None = None
        if chunk.any_grad and chunk.weight_sum > 0:
            if chunk.scale != chunk.weight_sum:  # the weights changed this round
                chunk.merge.mul_(chunk.scale / chunk.weight_sum)
            if chunk.optimizer is not None:
                chunk.optimizer.step(chunk.merge.to(chunk.value.dtype))
                result = chunk.value
            else:
                result = chunk.merge
            chunk.version += 1
        elif chunk.optimizer is not None:
            result = chunk.value  # no gradient anywhere: torch skips the step, so do we
        if self._consistency.synchronous:
            # Zero-copy is safe under BSP: no worker pushes this chunk again (and so nothing
            # overwrites this buffer) before it has received this message.
            for waiter in chunk.waiting:
                self._send_value(waiter.peer, waiter.rid, chunk, result, waiter.slot)
        else:
            # Asynchronous: the buffer changes with the next push, so replies carry a copy.
            snapshot = None if result is None else result.clone()
            for waiter in chunk.waiting:
                waiter.value = snapshot
            chunk.held.extend(chunk.waiting)
            self._release(chunk)
        chunk.waiting = []
        chunk.arrived.clear()
        if self._consistency.synchronous and chunk.weight_sum > 0:
            chunk.last_sum = chunk.weight_sum
        chunk.scale = 0.0
        chunk.weight_sum = 0.0
        chunk.any_grad = False
        chunk.round += 1
        if chunk.round > self._step:
            self._step = chunk.round
            if self._straggler:
                self._straggler.on_step(self._step)
        if chunk.spec.id in self._outgoing:
            self._maybe_hand_over(chunk.spec.id)

    def _release(self, chunk: _Chunk) -> None:
        """Send the held replies the consistency policy lets go (SSP holds fast workers)."""
        progress = {w: c + 1 for w, c in chunk.last_clock.items()}
        keep = []
        for waiter in chunk.held:
            if self._consistency.may_release(waiter.clock_after, progress, self._workers):
                self._send_value(waiter.peer, waiter.rid, chunk, waiter.value, waiter.slot)
            else:
                keep.append(waiter)
        chunk.held = keep

    def _shared(
        self, header: Header, frames: Sequence[memoryview]
    ) -> tuple[_Slot, list[memoryview]]:
        """A push whose gradient is in the worker's shared memory: its slot, and the
        gradient's bytes there. Raises :class:`ProtocolError`: MALFORMED for a bad ``sm``
        or a slot outside the arena, NO_SHM if the arena cannot be mapped here."""
        sm = header["sm"]
        if (
            frames
            or not isinstance(sm, list)
            or len(sm) != 3
            or not isinstance(sm[0], str)
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in sm[1:])
        ):
            raise ProtocolError(
                ErrorCode.MALFORMED.value,
                "'sm' must be [arena, offset, capacity], with no tensor frame",
            )
        name, offset, capacity = sm
        arena = self._arenas.get(name)
        if arena is None:
            if not name.startswith(job_prefix(self.config.job)):
                raise ProtocolError(
                    ErrorCode.MALFORMED.value, f"{name!r} is not an arena of this job"
                )
            try:
                arena = Arena.attach(name)
            except (OSError, ValueError) as exc:
                raise ProtocolError(
                    ErrorCode.NO_SHM.value,
                    f"server {self.index} cannot map shared memory {name!r} ({exc}); "
                    "send it the bytes",
                ) from None
            self._arenas[name] = arena
        nbytes = field(header, "n", int) * DTYPE_SIZES.get(field(header, "dt", str), 0)
        try:
            if nbytes > capacity:
                raise ValueError(f"{nbytes} bytes do not fit a slot of {capacity}")
            arena.view(offset, capacity)
            data = arena.view(offset, nbytes)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.MALFORMED.value, str(exc)) from None
        # What a socket would have carried: for the speed figure and a bandwidth cap.
        self._bytes += nbytes
        if self._straggler:
            self._straggler.on_bytes(nbytes, self._step)
        return _Slot(arena, offset, capacity), [data]

    def _send_value(
        self,
        peer: Peer,
        rid: int,
        chunk: _Chunk,
        t: torch.Tensor | None,
        slot: _Slot | None = None,
    ) -> None:
        header: Header = {
            "o": int(Data.VALUE),
            "i": rid,
            "c": chunk.spec.id,
            "v": chunk.version,
            "k": chunk.round,
            "n": chunk.spec.numel,
        }
        if t is None:
            header["z"] = True
            self._loop.send(peer, header)
            return
        header["dt"] = WIRE_DTYPES[t.dtype]
        if t is chunk.value:
            frame = chunk.value_bytes
        elif t is chunk.merge:
            frame = chunk.merge_bytes
        else:
            frame = as_bytes(t)
        self._bytes += frame.nbytes  # what this server moves, both ways, for its speed figure
        if self._straggler:
            self._straggler.on_bytes(frame.nbytes, self._step)
        if slot is not None and frame.nbytes <= slot.capacity:
            # The push's gradient was consumed on arrival: its slot takes the value.
            slot.arena.buf[slot.offset : slot.offset + frame.nbytes] = frame
            header["sm"] = 1
            self._loop.send(peer, header)
            return
        self._loop.send(peer, header, inline(header, frame))

    def describe(self) -> str:
        """Its protocol state for a hung job's dump (:data:`STACK_SIGNAL`): the chunks
        with a round in progress or on their way out or in, handovers not yet acked.
        Only reads; never blocks."""
        rounds = [ch.round for ch in self._chunks.values()]
        lines = [
            f"server {self.index} ({self.state.value}): map epoch {self._epoch}, step "
            f"{self._step}, owns {len(self._chunks)} chunks, rounds "
            f"{min(rounds, default=0)}..{max(rounds, default=0)}"
        ]
        for cid, ch in sorted(self._chunks.items()):
            if ch.arrived or ch.waiting or ch.held or cid in self._outgoing:
                cut, owner = self._outgoing.get(cid, (-1, -1))
                lines.append(
                    f"  chunk {cid}: round {ch.round}, pushed by workers {sorted(ch.arrived)}, "
                    f"{len(ch.waiting)} waiting, {len(ch.held)} held"
                    + (f", leaving for server {owner} from clock {cut}" if owner >= 0 else "")
                )
        for cid, queued in sorted(self._incoming.items()):
            lines.append(f"  chunk {cid}: arriving, {len(queued)} requests wait for it")
        if self._handing:
            lines.append(f"  handed over, not yet acked: chunks {sorted(self._handing.values())}")
        if self._early:
            lines.append(f"  {len(self._early)} handovers of a map not yet received")
        return "\n".join(lines)

    def stats(self) -> dict[str, Any]:
        """Counters and versions, for tests and the coordinator. Loop thread only."""
        return {
            "index": self.index,
            "epoch": self._epoch,
            "versions": {str(c): ch.version for c, ch in self._chunks.items()},
            "pushes": sum(ch.pushes for ch in self._chunks.values()),
            "shared": self._shared_pushes,
            "lane": self._lane_pushes,
            "dropped": sum(ch.dropped for ch in self._chunks.values()),
            "discounted": sum(ch.discounted for ch in self._chunks.values()),
            "held": sum(len(ch.held) for ch in self._chunks.values()),
            "errors": self._loop.errors_sent,
            "moved_in": self.moved_in,
            "moved_out": self.moved_out,
            "busy_s": self._busy_s,
            "bytes": self._bytes,
        }


class _Moved(Exception):
    def __init__(self, chunk: int, owner: int, epoch: int) -> None:
        super().__init__(chunk, owner, epoch)
        self.chunk, self.owner, self.epoch = chunk, owner, epoch
