"""A server's chunks and their arithmetic: validate a push, merge it, update the chunk,
and say which replies must go out. Nothing here sends: the server's loop does, so the
store is tested without a transport (``tests/unit/test_server_store.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec, TensorSpec, make_chunks
from trimtab.errors import ChunkMoved, ProtocolError
from trimtab.policies.consistency import CONSISTENCY, ConsistencyPolicy, PushInfo
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header, payload_frames
from trimtab.roles.server.chunk import NO_REPLIES as NO_REPLIES
from trimtab.roles.server.chunk import Chunk as Chunk
from trimtab.roles.server.chunk import Reply as Reply
from trimtab.roles.server.chunk import keep_mean as keep_mean
from trimtab.roles.server.chunk import mean_of as mean_of
from trimtab.roles.server.growing import read_grown, totals
from trimtab.roles.server.lifecycle import ChunkPhase, Move
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.optim import OptimizerMode
from trimtab.roles.server.rows import (
    answer_for,
    apply_rows,
    follow_hot,
    hot_answer,
    is_rows,
    merge_rows,
    read_ids,
    read_rows,
)
from trimtab.roles.server.slots import SharedArenas
from trimtab.runtime.rows import width_of
from trimtab.runtime.tensors import check_tensor_frames
from trimtab.runtime.trace import Trace
from trimtab.transport import Peer


class ChunkStore:
    """The chunks one server holds, the job's terms they follow (tensors, optimizer,
    workers, consistency), and the placement it knows.

    :meth:`push` validates and merges a gradient and, when the consistency policy says
    the round is complete, applies the update; it returns the :class:`Reply` objects to
    send now. Not thread-safe: the server's loop owns it. Nothing here blocks. Bad input
    raises :class:`ProtocolError` (with an :class:`ErrorCode`) before any state
    changes; a chunk this server does not hold raises :class:`ChunkMoved`.

    Attributes:
        index: this server's index (-1 until it registered).
        chunks: the chunks held (OWNED or LEAVING), by id.
        moves: the chunks on the move here, by id (written by the handover).
        owners: each chunk's owner in the latest map; ``epoch`` that map's epoch.
    """

    def __init__(self, meter: LoadMeter, arenas: SharedArenas) -> None:
        self.meter = meter
        self.arenas = arenas
        self.index = -1
        self.chunks: dict[int, Chunk] = {}
        self.moves: dict[int, Move] = {}
        self.owners: tuple[int, ...] = ()
        self.epoch = 0
        self.workers: set[int] = set()
        self.servers: tuple[str, ...] = ()
        self.mode = OptimizerMode.SERVER
        self.consistency: ConsistencyPolicy = CONSISTENCY.create("bsp")
        self.tensors: list[TensorSpec] = []
        self.specs: list[ChunkSpec] = []
        # Each table's opt (one per DistributedOptimizer), and each tensor's table.
        self._opts: list[dict[str, Any]] = []
        self._table_of: list[int] = []
        #: The job map that told it the tables (MAP, EXTEND), without its request keys.
        self.job: dict[str, Any] = {}
        self.shared_pushes = 0  # pushes whose gradient came through shared memory
        self.lane_pushes = 0  # pushes that came over the transport's local lane
        #: Called with each chunk whose round just completed (a checkpoint's snapshot).
        self.on_round: Callable[[Chunk], None] | None = None
        #: ``--trace``: each push's merge and each round's update marked on it.
        self.trace: Trace | None = None

    # -- the job and the map -----------------------------------------------------------

    def learn_job(self, header: headers.JobMapHeader) -> None:
        """Take what every map carries about the job (MAP or MIGRATE, read): tensors,
        each table's optimizer, workers, consistency. Raises a MALFORMED
        :class:`ProtocolError` for bad tables (see :meth:`learn_tables`)."""
        self.learn_tables(header)
        self.workers = set(header["workers"])
        self.servers = tuple(header["servers"])
        self.consistency = CONSISTENCY.create(
            header.get("consistency", "bsp"),
            workers=len(self.workers),
            **header.get("consistency_args", {}),
        )

    def learn_tables(self, header: headers.JobMapHeader) -> None:
        """Take a job map's tensors and tables (one per DistributedOptimizer, each with
        its opt: class, mode, groups); the chunks are cut from every table's tensors in
        order. Raises a MALFORMED :class:`ProtocolError` for tables that do not cover the
        tensors or an unknown mode, and then nothing changed."""
        tables = headers.read_tables(header)
        for _, opt in tables:
            if opt.get("mode") not in tuple(m.value for m in OptimizerMode):
                raise ProtocolError(
                    ErrorCode.MALFORMED.value, f"a table's optimizer mode {opt.get('mode')!r}"
                )
        self.tensors = [TensorSpec.from_wire(t) for t in header["tensors"]]
        self.specs = make_chunks(self.tensors, header["chunk_bytes"])
        self.job = {k: v for k, v in header.items() if k not in ("o", "i", "j")}
        self._opts = [opt for _, opt in tables]
        self._table_of = [i for i, (n, _) in enumerate(tables) for _ in range(n)]
        self.mode = OptimizerMode(self._opts[0]["mode"])

    def post_factor(self, table: int) -> float:
        """What every round's weighted mean gradient of ``table``'s chunks is multiplied
        by before it is applied or answered: its workers' ``op`` (Sum: the number of
        workers) times their ``gradient_predivide_factor`` (they divided by it before
        pushing). Pure."""
        opt = self._opts[table]
        factor = float(opt.get("post", 1.0))
        return factor * len(self.workers) if opt.get("op") == "sum" else factor

    def table_of(self, spec: ChunkSpec) -> int:
        """The table (optimizer) whose tensor ``spec`` is a chunk of. Pure."""
        return self._table_of[spec.tensor]

    def new_chunk(self, spec: ChunkSpec) -> Chunk:
        """A fresh chunk of ``spec`` under its table's optimizer (zero value, version 0)."""
        opt = self._opts[self._table_of[spec.tensor]]
        hp = opt["groups"][self.tensors[spec.tensor].group]
        server = opt["mode"] == OptimizerMode.SERVER.value
        return Chunk(spec, (opt["cls"], hp) if server else None)

    def apply_map(self, header: headers.JobMapHeader) -> None:
        """Take the job's first map (MAP, read): hold, fresh, every chunk it gives this
        server."""
        self.learn_job(header)
        self.owners = tuple(header["owners"])
        self.epoch = header["epoch"]
        self.chunks = {
            spec.id: self.new_chunk(spec)
            for spec in self.specs
            if self.owners[spec.id] == self.index
        }

    def extend(self, header: headers.ExtendHeader) -> list[int]:
        """Take an EXTEND (read): the job grew by a table; hold, fresh, each of its
        chunks (the ids after those known) the new map gives this server. Returns their
        ids. Raises as :meth:`learn_tables`, and then nothing changed."""
        known = len(self.specs)
        if known:
            self.learn_tables(header)
        else:  # joined after the job started, and given nothing yet: all is news
            self.learn_job(header)
        self.servers = tuple(header["servers"])
        self.owners = tuple(header["owners"])
        self.epoch = header["epoch"]
        added = [s.id for s in self.specs[known:] if self.owners[s.id] == self.index]
        for cid in added:
            self.chunks[cid] = self.new_chunk(self.specs[cid])
        return added

    def owned(self, cid: int) -> Chunk:
        """Chunk ``cid`` (a read header's ``c``). Raises :class:`ChunkMoved` if another
        server has it, an UNKNOWN_CHUNK :class:`ProtocolError` for an id out of range."""
        chunk = self.chunks.get(cid)
        if chunk is not None:
            return chunk
        if 0 <= cid < len(self.owners):
            raise ChunkMoved(cid, self.owners[cid], self.epoch)
        raise ProtocolError(
            ErrorCode.UNKNOWN_CHUNK.value,
            f"no chunk {cid} in this job ({len(self.owners)} chunks at epoch {self.epoch})",
        )

    # -- the data path -----------------------------------------------------------------

    def push(
        self, peer: Peer, header: Header, frames: Sequence[memoryview], lane: bool
    ) -> Sequence[Reply]:
        """Validate a PUSH (``header`` as decoded, ``frames``: those after the header;
        ``lane``: whether it came over the local lane) and merge its gradient, scaled by
        its weight; apply the update if the round is complete. Returns the replies to
        send now.

        Checks, in order: the inline payload (MALFORMED), every key's type
        (:func:`~trimtab.protocol.headers.read_push`: MALFORMED), the chunk (MOVED,
        UNKNOWN_CHUNK), the shared-memory slot, the cut of a leaving chunk (MOVED), the
        worker (BAD_STATE), the weight (MALFORMED), the consistency policy and a second
        push of the round (BAD_STATE), the tensor (BAD_DTYPE, BAD_SHAPE, MALFORMED)."""
        trace = self.trace
        start = 0.0 if trace is None else trace.now()
        frames = payload_frames(header, frames)
        msg = headers.read_push(header)
        chunk = self.owned(msg["c"])
        slot = None
        if "sm" in msg:
            slot, frames = self.arenas.read(msg, frames, self.index)
            # What a socket would have carried: for the speed figure.
            self.meter.count(frames[0].nbytes)
        rank = msg["r"]
        clock = msg["k"]
        move = self.moves.get(chunk.spec.id)
        if move is not None and move.phase is ChunkPhase.LEAVING and clock >= move.cut:
            raise ChunkMoved(chunk.spec.id, move.owner, self.epoch)
        weight = msg["w"]
        if rank not in self.workers:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"worker {rank} is not in this job")
        if weight <= 0:
            raise ProtocolError(ErrorCode.MALFORMED.value, "'w' must be positive")
        info = PushInfo(rank, clock, float(weight), msg.get("v", chunk.version), chunk.version)
        why = self.consistency.check(info, chunk.round, chunk.last_clock.get(rank))
        if why is not None:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"chunk {chunk.spec.id}: {why}")
        if rank in chunk.arrived:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"worker {rank} already pushed chunk {chunk.spec.id} for clock {clock}",
            )
        grad = rows = None
        if "sr" in msg:  # a sparse gradient's rows (roles/server/rows.py)
            rows = read_rows(chunk, width_of(self.tensors[chunk.spec.tensor].shape), msg, frames)
        elif not msg.get("z", False):
            if is_rows(chunk):
                raise ProtocolError(ErrorCode.BAD_STATE.value, "a dense push to a round of rows")
            grad = check_tensor_frames(
                header, frames, chunk.spec.dtype, chunk.spec.numel, compressed=True
            )
        hp = msg.get("hp")
        # Everything is validated: from here on the chunk's state changes.
        if rows is not None and rows[2] is not None:
            chunk.hot[rank] = rows[2]
            if not self.consistency.synchronous:  # (its answer: the set's current rows)
                chunk.hot_changed[rank] = rows[2][1]
        if msg.get("g"):
            chunk.mean_only = True
        if hp and chunk.optimizer is not None:
            chunk.optimizer.set_hparams(hp)
        discount = self.consistency.discount(info)
        chunk.pushes += 1
        self.shared_pushes += slot is not None
        self.lane_pushes += lane
        if discount is None:
            chunk.dropped += 1
        else:
            if discount < 1.0:
                chunk.discounted += 1
            w = float(weight) * discount
            if self.consistency.synchronous:
                chunk.weight_sum += float(weight)
                if not chunk.any_grad and chunk.scale <= 0:
                    # The round's divisor, predicted as last round's sum of weights (or
                    # this weight times the workers), so that each arrival is scaled as
                    # it is merged rather than the sum divided in a pass of its own;
                    # update() corrects the rare round whose weights changed.
                    chunk.scale = chunk.last_sum or float(weight) * len(self.workers)
            else:
                # Each push is an update of its own: it counts its worker's share of the
                # global batch (b_i / sum of the latest b_j), so N pushes move the model
                # as far as one synchronous step would.
                chunk.last_weight[rank] = float(weight)
                chunk.weight_sum = sum(
                    chunk.last_weight.get(r, float(weight)) for r in self.workers
                )
                chunk.scale = chunk.weight_sum
            if rows is not None:
                merge_rows(chunk, rows, w / chunk.scale)
            elif grad is not None:
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
        if trace is not None:  # received, checked and merged: the push's span here
            trace.span("merge", chunk.spec.id, start, clock, rank)
        chunk.waiting.append(Reply(peer, msg["i"], rank, clock + 1, chunk, slot, msg.get("vk", 0)))
        if self.consistency.ready(chunk.arrived, self.workers):
            return self.update(chunk)
        return NO_REPLIES

    def update(self, chunk: Chunk) -> list[Reply]:
        """Complete the chunk's round: apply the merged gradient (or hand it out, in
        summation mode), advance version and round. Returns the replies to send now:
        every waiting one (synchronous), or those the policy releases (asynchronous)."""
        trace = self.trace
        start = 0.0 if trace is None else trace.now()
        result: torch.Tensor | None = None
        applies = chunk.optimizer is not None and not chunk.mean_only
        ids = None
        width = 0  # (a table's row width: read only where the round merged rows)
        if chunk.rows is not None and chunk.weight_sum > 0:  # (is_rows: a call a round)
            width = width_of(self.tensors[chunk.spec.tensor].shape)
            factor = self.post_factor(self._table_of[chunk.spec.tensor])
            ids, result = apply_rows(chunk, width, factor * chunk.scale / chunk.weight_sum, applies)
            chunk.version += 1
        elif chunk.any_grad and chunk.weight_sum > 0:
            factor = self.post_factor(self._table_of[chunk.spec.tensor])
            if chunk.scale != chunk.weight_sum:  # the weights changed this round
                factor *= chunk.scale / chunk.weight_sum
            if factor != 1.0:
                chunk.merge.mul_(factor)
            if applies:
                assert chunk.optimizer is not None
                merge = chunk.merge  # (a no-op .to() costs a torch dispatch: 2 us)
                if merge.dtype != chunk.value.dtype:
                    merge = merge.to(chunk.value.dtype)
                chunk.optimizer.step(merge)
                result = chunk.value
                if self.consistency.synchronous:
                    keep_mean(chunk)
            else:
                result = chunk.merge
            chunk.version += 1
        elif applies:
            result = chunk.value  # no gradient anywhere: torch skips the step, so do we
            if self.consistency.synchronous:
                chunk.mean_round, chunk.mean_any = chunk.round, False
        chunk.mean_only = False
        if self.consistency.synchronous:
            # Zero-copy is safe under BSP: no worker pushes this chunk again (and so nothing
            # overwrites this buffer) before it has received this message.
            replies = chunk.waiting
            for reply in replies:
                reply.value, reply.rows = result, ids
                if ids is not None and result is not None and reply.rank in chunk.hot:
                    reply.rows, reply.value = answer_for(chunk, width, reply.rank, ids, result)
                reply.round = chunk.round
        else:
            # Asynchronous: the buffer changes with the next push, so replies carry a copy;
            # a worker's hot rows follow every worker's updates (rows.py's follow_hot).
            snapshot = None
            follows = ids is not None and applies and bool(chunk.hot)
            if follows:
                assert ids is not None
                follow_hot(chunk, ids)
            for reply in chunk.waiting:
                if follows and reply.rank in chunk.hot:
                    reply.rows, reply.value = hot_answer(chunk, width, reply.rank)
                    continue
                if snapshot is None and result is not None:
                    snapshot = result.clone()
                reply.value, reply.rows = snapshot, ids
            chunk.held.extend(chunk.waiting)
            replies = self.release(chunk)
        chunk.waiting = []
        chunk.arrived.clear()
        if self.consistency.synchronous and chunk.weight_sum > 0:
            chunk.last_sum = chunk.weight_sum
        chunk.scale = 0.0
        chunk.weight_sum = 0.0
        chunk.any_grad = False
        chunk.round += 1
        self.meter.advance(chunk.round)
        if self.on_round is not None:
            self.on_round(chunk)
        if trace is not None:
            trace.span("update", chunk.spec.id, start, chunk.round - 1)
        return replies

    def pull_rows(
        self, peer: Peer, rid: int, msg: headers.PullHeader, frames: Sequence[memoryview]
    ) -> Reply:
        """Answer a row PULL (``msg`` read, with ``sr``; ``frames``: its ids): the reply
        carrying those rows' current elements in the chunk (with ``gw``, ids of a
        growing table: :func:`~.growing.read_grown`). Raises as :meth:`owned`, and a
        MALFORMED :class:`ProtocolError` as :func:`~.rows.read_ids`. Never blocks."""
        chunk = self.owned(msg["c"])
        width = width_of(self.tensors[chunk.spec.tensor].shape)
        reply = Reply(peer, rid, -1, 0, chunk, None)
        reply.round = chunk.round
        if "gw" in msg:  # ids of a growing table: its rows, as the map gives them
            reply.rows, reply.value = read_grown(chunk, width, msg, frames)
            return reply
        frame = frames[0] if len(frames) == 1 else memoryview(b"")
        ids, positions = read_ids(chunk, width, int(msg.get("sr", 0)), frame)
        reply.rows, reply.value = ids, chunk.value[positions]
        return reply

    def set_workers(self, ranks: Iterable[int]) -> list[Reply]:
        """The job's workers are ``ranks`` from now on (WORKERS: a worker was lost, or
        one joined at a step boundary). A round that waited only for workers no longer
        in the job completes now with the pushes that arrived, each weighted by its
        samples, so the mean is over the samples actually processed; a lost worker's
        push merged already stays in. Returns the replies to send now. Never blocks."""
        self.workers = set(ranks)
        out: list[Reply] = []
        for chunk in self.chunks.values():
            if chunk.waiting and self.consistency.ready(chunk.arrived, self.workers):
                out.extend(self.update(chunk))
        return out

    def release(self, chunk: Chunk) -> list[Reply]:
        """The held replies the consistency policy lets go now (SSP holds fast workers'),
        taken off the chunk."""
        progress = {w: c + 1 for w, c in chunk.last_clock.items()}
        keep, out = [], []
        for reply in chunk.held:
            if self.consistency.may_release(reply.clock_after, progress, self.workers):
                reply.round = chunk.round
                out.append(reply)
            else:
                keep.append(reply)
        chunk.held = keep
        return out

    def init(
        self, header: Header, frames: Sequence[memoryview], rank: int, adoption: int | None
    ) -> None:
        """Set a chunk's value from an INIT of worker ``rank`` (``header`` as decoded,
        ``frames``: those after the header). Without ``adoption``, the seeding at
        declaration: only from :data:`~trimtab.protocol.headers.SEED_ROOT`, once per
        chunk, before any push of it. With ``adoption`` (an adoption's number, its grant
        for ``rank`` checked by the caller): once per chunk and adoption, newer than the
        chunk's last, with no push of the round in. Raises MALFORMED for a mistyped key,
        then as :meth:`owned`, then FORBIDDEN from another worker, BAD_STATE for a chunk
        seeded or pushed already (an old adoption), then BAD_DTYPE, BAD_SHAPE or
        MALFORMED for the tensor; nothing changed then."""
        chunk = self.owned(headers.read_init(header)["c"])
        if adoption is not None:
            if adoption <= chunk.adopted or chunk.arrived:
                raise ProtocolError(
                    ErrorCode.BAD_STATE.value,
                    f"chunk {chunk.spec.id}: adoption {adoption} is not newer than its last "
                    f"({chunk.adopted}), or a push of this round is in",
                )
            value = check_tensor_frames(header, frames, chunk.spec.dtype, chunk.spec.numel)
            chunk.value.copy_(value)
            chunk.adopted = adoption
            return
        if rank != headers.SEED_ROOT:
            raise ProtocolError(
                ErrorCode.FORBIDDEN.value,
                f"only worker {headers.SEED_ROOT} seeds the chunks, not worker {rank}",
            )
        if chunk.seeded or chunk.round or chunk.version or chunk.arrived or chunk.pushes:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"chunk {chunk.spec.id} was seeded or trained already: an INIT is taken "
                "only at declaration",
            )
        value = check_tensor_frames(header, frames, chunk.spec.dtype, chunk.spec.numel)
        chunk.value.copy_(value)
        chunk.seeded = True

    def stats(self) -> dict[str, Any]:
        """Versions and counters of the chunks held, as ``Server.stats`` reports them."""
        held = self.chunks.values()
        grown = totals(held)
        return {
            **({"growing": grown} if grown else {}),
            "versions": {str(c): ch.version for c, ch in self.chunks.items()},
            "pushes": sum(ch.pushes for ch in held),
            "shared": self.shared_pushes,
            "lane": self.lane_pushes,
            "dropped": sum(ch.dropped for ch in held),
            "discounted": sum(ch.discounted for ch in held),
            "held": sum(len(ch.held) for ch in held),
        }
