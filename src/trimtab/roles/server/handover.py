"""Chunks changing hands between servers: the cuts of a new map, the HANDOVER of a
chunk (value, optimizer state, version, round) to its new owner, and its arrival there.

Each chunk on the move has a :class:`~trimtab.roles.server.lifecycle.Move` whose
:class:`~trimtab.roles.server.lifecycle.ChunkPhase` says where it stands. Nothing here
sends: :class:`Handover` returns the messages, the server's loop sends them.

Between servers of one machine a HANDOVER's bytes go through the old owner's shared
memory, as a REPLICATE's do (:mod:`.replica_shm`: one arena per chunk, only the header on
the socket): a migration of every chunk moves the model's bytes with two memcpys instead
of a socket's copies into and out of the kernel. The arena is safe to reuse once the new
owner acknowledged, which it does after copying the chunk out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import torch

from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.protocol.replica import ReplicateHeader
from trimtab.roles.server.cuts import cut_of, rounds_under_way, spread
from trimtab.roles.server.growing import encode_grown, take_grown
from trimtab.roles.server.lifecycle import ChunkPhase, Move
from trimtab.roles.server.optim import ChunkOptimizer, hyperparameters
from trimtab.roles.server.replica_shm import ReplicaArenas
from trimtab.roles.server.store import Chunk, ChunkStore
from trimtab.runtime.credentials import Credentials
from trimtab.runtime.tensors import WIRE_DTYPES, as_bytes, check_tensor_frames, tensor_from
from trimtab.transport import Frame, Peer
from trimtab.transport.shm import is_local

log = logging.getLogger("trimtab.server")

#: HANDOVERs of a map not yet received, held at most: a count and their bytes in all.
#: Past either, one more is refused (TOO_LARGE) and nothing is held for it; its sender
#: fails the migration loudly rather than this server running out of memory.
EARLY_MAX = 1024
EARLY_MAX_BYTES = 1 << 30

#: Requests held for one chunk on its way here, at most, per worker of the job (a
#: worker has at most a push and a pull of a chunk in flight; the rest is slack).
QUEUED_PER_WORKER = 4


def encode_state(
    opt: ChunkOptimizer, frames: list[Frame], grown: bool = True
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """A chunk optimizer's hyperparameters and state, for a HANDOVER's ``hp`` and
    ``st`` (per key, ``["t", dtype, shape]`` for a tensor, whose bytes are appended to
    ``frames``, or ``["v", value]``), with a growing table's map unless not ``grown``
    (roles/server/growing.py). Never blocks."""
    hp = hyperparameters(opt.optimizer.param_groups[0])
    state = opt.optimizer.state.get(opt.param, {})
    meta: dict[str, list[Any]] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous()
            meta[key] = ["t", WIRE_DTYPES[t.dtype], list(t.shape)]
            frames.append(as_bytes(t.view(-1)) if t.numel() else b"")
        else:
            meta[key] = ["v", value]
    if grown and opt.grown is not None:
        encode_grown(opt.grown, meta, frames)
    return hp, meta


def decode_state(
    opt: ChunkOptimizer, header: headers.HandoverHeader, frames: Sequence[memoryview]
) -> None:
    """Restore what :func:`encode_state` returned, as a read HANDOVER carries it, into
    ``opt`` (``frames``: the state's, after the value's). Never blocks. Raises a
    MALFORMED :class:`ProtocolError` for a missing ``st``; tensors are copied out of the
    frames."""
    hp = header.get("hp")
    if hp is not None:
        opt.set_hparams(hp)
    meta = header.get("st")
    if meta is None:
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            "a handover to a server-mode optimizer needs its state 'st'",
        )
    state: dict[str, Any] = {}
    rest = list(frames)
    for key, (kind, *info) in meta.items():
        if kind == "t":
            dtype, shape = info
            numel = 1
            for d in shape:
                numel *= d
            t = tensor_from(rest.pop(0), dtype, numel) if numel else torch.empty(0)
            state[key] = t.clone().view(shape)
        else:
            state[key] = info[0]
    state, grown = take_grown(state)
    if grown is not None:
        opt.grown = grown
    if state:
        opt.optimizer.state[opt.param] = state


class Handover:
    """The migrations of one server's chunks, over its :class:`ChunkStore`.

    Not thread-safe: the server's loop owns it. Nothing here blocks.

    Attributes:
        early: HANDOVERs of a map this server has not received yet, in arrival order.
        moved_in, moved_out: chunks received, and handed over and acknowledged.
    """

    def __init__(self, store: ChunkStore, credentials: Credentials, shared: bool = True) -> None:
        self.store = store
        self.credentials = credentials
        self.arenas = ReplicaArenas(credentials.job, shared)
        store.arenas.close_with(self.arenas.close)
        self.moves = store.moves
        self.early: list[tuple[Peer, list[memoryview]]] = []
        self.early_bytes = 0
        self.moved_in = 0
        self.moved_out = 0
        self._rids = 0

    def plan(self, header: headers.MigrateHeader) -> dict[str, int]:
        """Take a MIGRATE map (read): decide, for each chunk leaving, the clock from which it
        is its new owner's (:func:`~trimtab.roles.server.cuts.cut_of`: the round in
        progress if its table's round has not begun here, no push of it in and no chunk
        of the table past it, else the next), and expect the chunks arriving. Returns
        the cuts, by chunk id."""
        store = self.store
        if not store.specs:
            store.learn_job(header)  # a server that joined after the job started
        store.servers = tuple(header["servers"])
        owners = tuple(header["owners"])
        cuts: dict[str, int] = {}
        under_way = rounds_under_way(store)
        leaving = sorted(
            cid for cid in store.chunks if owners[cid] != store.index and cid not in self.moves
        )
        later = spread(store, leaving)
        for cid in leaving:
            chunk = store.chunks[cid]
            cut = cut_of(chunk, store.table_of(chunk.spec), under_way) + later[cid]
            self.moves[cid] = Move(cid, ChunkPhase.LEAVING, cut, owners[cid])
            cuts[str(cid)] = cut
        old = store.owners
        for cid, owner in enumerate(owners):
            if owner == store.index and cid not in store.chunks and cid not in self.moves:
                move = self.moves[cid] = Move(cid, ChunkPhase.ARRIVING)
                move.source = old[cid] if cid < len(old) else -1
        store.owners = owners
        store.epoch = header["epoch"]
        log.info(
            "server %d: map epoch %d, %d chunks leaving, %d arriving",
            store.index,
            store.epoch,
            len(cuts),
            self.arriving(),
        )
        return cuts

    def arriving(self) -> int:
        """How many chunks this server expects."""
        return sum(m.phase is ChunkPhase.ARRIVING for m in self.moves.values())

    def leaving(self) -> list[int]:
        """The chunks LEAVING, not yet handed over."""
        return [c for c, m in self.moves.items() if m.phase is ChunkPhase.LEAVING]

    def ready(self, cid: int) -> tuple[str, headers.HandoverHeader, list[Frame]] | None:
        """If chunk ``cid`` is LEAVING and every round before its cut is applied and
        answered, hand it over: return the new owner's address, the HANDOVER header and
        its frames (value, optimizer state, version and round go together); the chunk is
        HANDED and requests for it get MOVED from now on. Else None."""
        move = self.moves.get(cid)
        chunk = self.store.chunks.get(cid)
        if (
            move is None
            or move.phase is not ChunkPhase.LEAVING
            or chunk is None
            or chunk.round < move.cut
            or chunk.arrived
            or chunk.waiting
            or chunk.held
        ):
            return None
        frames: list[Frame] = [as_bytes(chunk.value)]
        hp = state = None
        if chunk.optimizer is not None:
            hp, state = encode_state(chunk.optimizer, frames)
        self._rids += 1
        move.rid = self._rids
        header = headers.handover(
            rid=move.rid,
            chunk=cid,
            version=chunk.version,
            round=chunk.round,
            epoch=self.store.epoch,
            dtype=WIRE_DTYPES[chunk.value.dtype],
            numel=chunk.spec.numel,
            counts=[chunk.pushes, chunk.dropped, chunk.discounted],
            sender=self.store.index,
            token=self.credentials.own,
            hp=hp,
            state=state,
            adopted=chunk.adopted,
        )
        move.to(ChunkPhase.HANDED)
        del self.store.chunks[cid]
        address = self.store.servers[move.owner]
        if is_local(address):
            shared = self.arenas.put(self.store.index, cid, frames)
            if shared is not None:
                header["sm"], frames = shared, []
        return address, header, frames

    def queue(self, cid: int, peer: Peer, frames: list[memoryview]) -> bool:
        """Hold a request for chunk ``cid`` if it is ARRIVING (answered once it
        arrived); whether it was held. Raises a BAD_STATE :class:`ProtocolError` (and
        holds nothing) past :data:`QUEUED_PER_WORKER` requests per worker."""
        move = self.moves.get(cid)
        if move is None or move.phase is not ChunkPhase.ARRIVING:
            return False
        if len(move.queued) >= QUEUED_PER_WORKER * max(1, len(self.store.workers)):
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"{len(move.queued)} requests already wait for chunk {cid} to arrive here",
            )
        move.queued.append((peer, frames))
        return True

    def hold_early(self, peer: Peer, frames: list[memoryview]) -> None:
        """Hold a HANDOVER of a map this server has not received yet (its sender's
        credential checked), until the map comes. Raises a TOO_LARGE
        :class:`ProtocolError` (and holds nothing) past :data:`EARLY_MAX` messages or
        :data:`EARLY_MAX_BYTES` bytes held."""
        nbytes = sum(f.nbytes for f in frames)
        if len(self.early) >= EARLY_MAX or self.early_bytes + nbytes > EARLY_MAX_BYTES:
            raise ProtocolError(
                ErrorCode.TOO_LARGE.value,
                f"server {self.store.index} already holds {len(self.early)} handovers "
                f"({self.early_bytes} bytes) of a map it has not received",
            )
        self.early.append((peer, frames))
        self.early_bytes += nbytes

    def take_early(self) -> list[tuple[Peer, list[memoryview]]]:
        """The HANDOVERs held by :meth:`hold_early`, in order; none are held after."""
        early, self.early, self.early_bytes = self.early, [], 0
        return early

    def is_arriving(self, cid: int) -> bool:
        """Whether chunk ``cid`` is on its way here."""
        move = self.moves.get(cid)
        return move is not None and move.phase is ChunkPhase.ARRIVING

    def arrive(
        self, header: Header, frames: Sequence[memoryview], sender: int
    ) -> list[tuple[Peer, list[memoryview]]]:
        """Take a HANDOVER (``header`` as decoded, ``frames``: those after the header):
        the chunk is OWNED here from now on. Returns the requests that waited for it, in
        order. Raises :class:`ProtocolError` (and then nothing changed): MALFORMED for a
        mistyped key (:func:`~trimtab.protocol.headers.read_handover`), BAD_STATE for a
        chunk this server does not expect, as ``check_tensor_frames`` for the value, or
        as :func:`decode_state`; FORBIDDEN if server ``sender`` (whose credential the
        caller checked) is not the chunk's old owner."""
        msg = headers.read_handover(header)
        cid = msg["c"]
        move = self.moves.get(cid)
        if move is None or move.phase is not ChunkPhase.ARRIVING:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"chunk {cid} handed to server {self.store.index}, which does not expect it",
            )
        if move.source >= 0 and sender != move.source:
            raise ProtocolError(
                ErrorCode.FORBIDDEN.value,
                f"chunk {cid} comes from server {move.source}, not server {sender}",
            )
        if "sm" in msg:  # the bytes are in the old owner's shared memory (as a REPLICATE's)
            frames = self.arenas.read(cast(ReplicateHeader, msg), msg["sm"], frames)
        spec = self.store.specs[cid]
        value = check_tensor_frames(header, frames[:1], spec.dtype, spec.numel)
        chunk: Chunk = self.store.new_chunk(spec)
        chunk.value.copy_(value)
        chunk.version = msg["v"]
        chunk.round = msg["k"]
        chunk.pushes, chunk.dropped, chunk.discounted = msg["p"]
        chunk.adopted = msg.get("ad", 0)  # an older adoption's INIT stays refused here
        if chunk.optimizer is not None:
            decode_state(chunk.optimizer, msg, frames[1:])
        move.to(ChunkPhase.OWNED)
        del self.moves[cid]
        self.store.chunks[cid] = chunk
        self.moved_in += 1
        return move.queued

    def handed(self, rid: int, peer: Peer) -> int | None:
        """The chunk whose HANDOVER request ``rid`` is, if one is HANDED to ``peer``
        (else None: an ACK from anyone else settles nothing)."""
        for cid, move in self.moves.items():
            if move.phase is ChunkPhase.HANDED and move.rid == rid and move.peer == peer:
                return cid
        return None

    def acked(self, cid: int) -> None:
        """The new owner acknowledged chunk ``cid``: this server is done with it."""
        self.moves[cid].to(None)
        del self.moves[cid]
        self.moved_out += 1
