"""Server replicas (``--replicas 1``): each chunk's primary keeps a backup server in
step after aggregation, and the backups take over when a server dies.

The scheme is *state forwarding*: once a round of a chunk is applied, its primary
sends the backup the chunk as of that round (REPLICATE: value, optimizer state,
version, round, counters, each worker's last clock), and releases the round's values
to the workers only when the backup acknowledged it. So a value a worker saw is never
lost, and a push is answered only once two servers hold its effect. Chunks are
replicated independently (many in flight at once, each chunk's acknowledgement
releasing only its own replies): the step does not serialise on them.

On a server's death the coordinator sends FAILOVER (a new map epoch): each backup of a
dead server's chunk promotes its copy to the chunk itself; every chunk whose backup
changed is replicated afresh to its new one (what waited for the dead backup's
acknowledgement waits for the new one's). The epoch is a fencing token: a REPLICATE
from a server that is not the chunk's owner under a newer failover map is refused
(STALE_EPOCH), and its sender, a primary the job declared dead, holds its replies.

Workers resend the pushes the dead server left unanswered; a push for a clock the
promoted copy has applied already is answered with the value, not applied again
(:meth:`Replicas.applied`).

Live placement moves *roles*, not bytes (:meth:`Replicas.remap`, a MIGRATE of a job
with replicas): a chunk moves only onto its backup, which promotes its copy while the
old owner demotes the chunk to a copy (or drops it) and answers what it held of the
chunk *moved*; a backup moves by a fresh REPLICATE to the new one. So a chunk is on two
servers at every step of a move. Nothing here sends: :mod:`.replica_link` does.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import cast

import torch

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ProtocolError
from trimtab.protocol import headers, replica
from trimtab.protocol.messages import ErrorCode, Header, payload_frames
from trimtab.roles.server.handover import decode_state, encode_state
from trimtab.roles.server.replica_shm import ReplicaArenas
from trimtab.roles.server.store import Chunk, ChunkStore
from trimtab.runtime.credentials import Credentials
from trimtab.runtime.tensors import TORCH_DTYPES, WIRE_DTYPES, as_bytes, check_tensor_frames
from trimtab.transport import Frame, Peer
from trimtab.transport.shm import is_local

log = logging.getLogger("trimtab.server")

#: What runs once a replication is acknowledged: sends the replies it held back.
Release = Callable[[], None]

#: The requests a release answers, (peer, request id): told *moved* instead if the
#: chunk leaves this server before its backup acknowledged.
Waiting = list[tuple[Peer, int]]

#: Requests to answer *moved*: (peer, request id, chunk id).
Moved = list[tuple[Peer, int, int]]

#: REPLICATEs of a failover map not yet received, held at most (each is a chunk's
#: value and state: the chunks a dead server's death gives new backups, at most).
EARLY_MAX = 1 << 16

#: REPLICATE request ids start here (see :data:`trimtab.protocol.replica.FIRST_RID`).
FIRST_RID = replica.FIRST_RID


class _InFlight:
    """A REPLICATE awaiting its ACK: its chunk, the backup it went to, its peer, what
    its acknowledgement releases, and the arena slot its bytes are in (-1: sockets)."""

    __slots__ = ("backup", "chunk", "peer", "releases", "slot", "waiting")

    def __init__(
        self, chunk: int, backup: int, releases: list[Release], waiting: Waiting, slot: int
    ) -> None:
        self.chunk = chunk
        self.backup = backup
        self.peer: Peer | None = None
        self.releases = releases
        self.waiting = waiting
        self.slot = slot


class Replicas:
    """One server's side of replication: the backup table, the copies it holds for
    other servers' chunks, and its replications in flight.

    Not thread-safe: the server's loop owns it. Nothing here blocks.

    Attributes:
        backup_of: each chunk's backup server (-1: none); empty without replicas.
        copies: the chunks this server backs up, by id (as of their last REPLICATE,
            whose bytes may still be in their primary's arena).
        retired: copies (and chunks) the last map took from this server, kept until
            the next one: should a server die while that map is being taken, one of
            them may be a chunk's newest copy (:meth:`holdings`).
        fence: the epoch of the last failover map taken (0: none yet).
        in_flight: REPLICATEs not yet acknowledged, by request id.
    """

    def __init__(self, store: ChunkStore, credentials: Credentials, shared: bool = True) -> None:
        self.store = store
        self.credentials = credentials
        self.arenas = ReplicaArenas(credentials.job, shared)
        store.arenas.close_with(self.arenas.close)
        self.backup_of: list[int] = []
        self.copies: dict[int, Chunk] = {}
        self.retired: dict[int, Chunk] = {}
        # Copies whose last REPLICATE came through shared memory: its header and frames
        # (views of the primary's arena), read into the copy only if it is promoted.
        self._unread: dict[int, tuple[replica.ReplicateHeader, torch.Tensor, list[memoryview]]]
        self._unread = {}
        # The arena slot each chunk's backup may hold (the last acknowledged): the
        # next REPLICATE through shared memory goes into the other one.
        self._held_slot: dict[int, int] = {}
        self.fence = 0
        self.in_flight: dict[int, _InFlight] = {}
        self._rids = itertools.count(FIRST_RID)
        self.replicated = 0  # REPLICATEs acknowledged
        self.shared = 0  # REPLICATEs sent through shared memory
        self.promoted = 0  # copies promoted to owned chunks

    def learn(self, header: headers.JobMapHeader) -> None:
        """Take the backup table of a job map (MAP or EXTEND, read). Raises a MALFORMED
        :class:`ProtocolError` for a table of another length than the chunks'."""
        if "bk" in header:
            self.backup_of = replica.read_backups(header, len(self.store.specs))

    def stats(self) -> dict[str, int]:
        """Counters for the server's STATS: REPLICATEs acknowledged and sent through
        shared memory, copies held, copies promoted, the last failover's epoch."""
        return {
            "replicated": self.replicated,
            "replicated_shared": self.shared,
            "copies": len(self.copies),
            "retired": len(self.retired),
            "promoted": self.promoted,
            "fence": self.fence,
        }

    def backup(self, cid: int) -> int:
        """Chunk ``cid``'s backup server, -1 for none."""
        return self.backup_of[cid] if cid < len(self.backup_of) else -1

    # -- the primary's side ------------------------------------------------------------

    def replicate(
        self, cid: int, releases: list[Release], waiting: Waiting
    ) -> tuple[str, replica.ReplicateHeader, list[Frame]] | None:
        """Chunk ``cid`` (held here) as of its last applied round, for its backup:
        the backup's address, the REPLICATE and its frames; ``releases`` (answering
        ``waiting``) run once the backup acknowledged it (:meth:`acked`). None if the
        chunk has no backup: the caller runs ``releases`` now."""
        backup = self.backup(cid)
        if backup < 0 or backup == self.store.index:
            return None
        chunk = self.store.chunks[cid]
        frames: list[Frame] = [as_bytes(chunk.value)]
        hp = state = None
        if chunk.optimizer is not None:
            hp, state = encode_state(chunk.optimizer, frames)
        rid = next(self._rids)
        header = replica.replicate(
            rid=rid,
            chunk=cid,
            version=chunk.version,
            round=chunk.round,
            epoch=self.store.epoch,
            sender=self.store.index,
            token=self.credentials.own or b"",
            dtype=WIRE_DTYPES[chunk.value.dtype],
            numel=chunk.spec.numel,
            counts=[chunk.pushes, chunk.dropped, chunk.discounted],
            last_sum=chunk.last_sum,
            last_clock=chunk.last_clock,
            hp=hp,
            state=state,
            adopted=chunk.adopted,
        )
        address = self.store.servers[backup]
        slot = -1
        if is_local(address) and not any(f.chunk == cid for f in self.in_flight.values()):
            free = 1 - self._held_slot.get(cid, 1)  # never the one the backup may hold
            shared = self.arenas.put(self.store.index, cid, frames, free)
            if shared is not None:
                header["sm"], frames, slot = shared, [], free
                self.shared += 1
        self.in_flight[rid] = _InFlight(cid, backup, releases, waiting, slot)
        return address, header, frames

    def sent(self, rid: int, peer: Peer) -> None:
        """REPLICATE ``rid`` went to ``peer``: only its ACK (or ERROR) settles it."""
        self.in_flight[rid].peer = peer

    def acked(self, rid: int, peer: Peer) -> list[Release] | None:
        """The releases of REPLICATE ``rid``, if ``peer`` is where it went (taken off:
        settled), else None (an answer to nothing of this server's replication)."""
        flight = self.settle(rid, peer)
        if flight is None:
            return None
        self.replicated += 1
        if flight.slot >= 0:
            self._held_slot[flight.chunk] = flight.slot
        return flight.releases

    def settle(self, rid: int, peer: Peer) -> _InFlight | None:
        """REPLICATE ``rid`` in flight to ``peer``, taken off (None: no such one)."""
        flight = self.in_flight.get(rid)
        if flight is None or flight.peer != peer:
            return None
        del self.in_flight[rid]
        return flight

    # -- the backup's side -------------------------------------------------------------

    def take(self, header: Header, frames: Sequence[memoryview], sender: int) -> None:
        """Take a REPLICATE (``header`` as decoded, ``frames``: those after the header)
        from server ``sender`` (whose credential the caller checked). Raises
        :class:`ProtocolError` (and then nothing changed): MALFORMED for a mistyped key,
        UNKNOWN_CHUNK, STALE_EPOCH from a server that is not the chunk's owner under a
        failover map newer than its epoch (a primary declared dead), FORBIDDEN from a
        server that is not the chunk's owner, BAD_STATE if this server is not the
        chunk's backup, or as ``check_tensor_frames`` and :func:`decode_state`."""
        frames = payload_frames(header, frames)
        msg = replica.read_replicate(header)
        shared = "sm" in msg
        if shared:
            frames = self.arenas.read(msg, msg["sm"], frames)
        cid = msg["c"]
        store = self.store
        if not 0 <= cid < len(store.specs):
            raise ProtocolError(ErrorCode.UNKNOWN_CHUNK.value, f"no chunk {cid} in this job")
        owner = store.owners[cid] if cid < len(store.owners) else -1
        if (sender != owner or self.backup(cid) != store.index) and msg["e"] < store.epoch:
            # Sent under an older map: its sender is to take the newer one (which moved
            # the chunk or its backup) or was declared dead; either way it holds on.
            raise ProtocolError(
                ErrorCode.STALE_EPOCH.value,
                f"chunk {cid}: a write of map epoch {msg['e']} from server {sender}; at "
                f"epoch {store.epoch} its owner is server {owner}, its backup server "
                f"{self.backup(cid)}",
            )
        if sender != owner:
            raise ProtocolError(
                ErrorCode.FORBIDDEN.value, f"chunk {cid} is server {owner}'s, not {sender}'s"
            )
        if self.backup(cid) != store.index:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"server {store.index} is not chunk {cid}'s backup (epoch {store.epoch})",
            )
        tensors = sum(1 for entry in msg.get("st", {}).values() if entry[:1] == ["t"])
        if len(frames) != 1 + tensors:
            raise ProtocolError(
                ErrorCode.MALFORMED.value,
                f"REPLICATE of chunk {cid}: {len(frames)} frames for a value and "
                f"{tensors} state tensors",
            )
        _check_state(msg, frames[1:])
        spec = store.specs[cid]
        value = check_tensor_frames(header, frames[:1], spec.dtype, spec.numel)
        copy = self.copies.get(cid)
        fresh = copy is None
        if copy is None:
            copy = store.new_chunk(spec)
        if copy.optimizer is not None and "st" not in msg:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"REPLICATE of chunk {cid}: no optimizer state 'st'"
            )
        # Everything is checked: from here on the copy changes.
        if shared:
            # The bytes stay where they are (the primary writes its other arena next):
            # read into the copy only if it is promoted.
            self._unread[cid] = (msg, value, list(frames[1:]))
        else:
            self._unread.pop(cid, None)
            _read(copy, msg, value, frames[1:])
        copy.version = msg["v"]
        copy.round = msg["k"]
        copy.pushes, copy.dropped, copy.discounted = msg["p"]
        copy.last_sum = float(msg["ls"])
        copy.last_clock = {r: k for r, k in msg["lc"]}
        copy.adopted = msg.get("ad", 0)
        copy.seeded = True
        if fresh:
            self.copies[cid] = copy

    def applied(self, chunk: Chunk, clock: int) -> bool:
        """Whether a push of ``clock`` for ``chunk`` is one resent after a failover for
        a round applied already (answered with the value, not applied again)."""
        return clock < chunk.round

    # -- failover ----------------------------------------------------------------------

    def failover(self, msg: replica.FailoverHeader) -> tuple[list[int], Moved]:
        """Take a FAILOVER (read): server ``dead`` is gone; the new owners and backups
        under epoch ``e``. As :meth:`remap`."""
        return self.remap(
            tuple(msg.get("owners", ())),
            list(msg.get("bk", ())),
            tuple(msg.get("servers", self.store.servers)),
            msg["e"],
            int(msg["dead"]),
        )

    def remap(
        self,
        owners: tuple[int, ...],
        backups: list[int],
        servers: tuple[str, ...],
        epoch: int,
        dead: int = -1,
    ) -> tuple[list[int], Moved]:
        """Take a map of new owners and backups under ``epoch`` (a FAILOVER, server
        ``dead`` lost; or a MIGRATE of a job with replicas, ``dead`` -1). Copies of
        chunks now owned here become the chunks; chunks held here and now owned
        elsewhere are demoted (:meth:`demote`); copies no longer backed up here are
        dropped. Returns the chunks owned here that must be replicated afresh (their
        backup changed, or what was in flight went to ``dead``), and the requests to
        answer *moved* (what this server held of the chunks it gave up)."""
        store = self.store
        old = list(self.backup_of)
        store.servers = servers
        store.epoch = max(store.epoch, epoch)
        self.fence = epoch
        self.backup_of = backups
        moved: Moved = []
        retired, self.retired = self.retired, {}
        for cid in [c for c in store.chunks if c < len(owners) and owners[c] != store.index]:
            moved += [(peer, rid, cid) for peer, rid in self.demote(cid)]
        store.owners = owners
        for cid, owner in enumerate(owners):
            if owner == store.index and cid not in store.chunks:
                copy = self._newest(cid, retired)
                if copy is not None:
                    self._read_out(cid, copy)
                else:
                    # Never replicated: nothing of it was ever acknowledged (an INIT's ACK
                    # waits for the replication too), so it starts afresh and the
                    # workers' resent requests seed it.
                    log.warning("server %d: chunk %d had no copy: fresh", store.index, cid)
                    copy = store.new_chunk(store.specs[cid])
                store.chunks[cid] = copy
                self.promoted += 1
        for cid in retired:  # (the map before the last one's: nobody's newest now)
            if cid not in self.copies and cid not in self.retired:
                self._unread.pop(cid, None)
                self.arenas.unmap(cid)
        for cid in [c for c in self.copies if self.backup(c) != store.index]:
            self.retired[cid] = self.copies.pop(cid)
        changed = [
            cid
            for cid in store.chunks
            if self.backup(cid) != (old[cid] if cid < len(old) else -1)
            or any(f.chunk == cid and f.backup == dead for f in self.in_flight.values())
        ]
        log.info(
            "server %d: map epoch %d (%s): owns %d chunks, %d to replicate afresh, %d "
            "requests moved",
            store.index,
            store.epoch,
            f"server {dead} lost" if dead >= 0 else "roles moved",
            len(store.chunks),
            len(changed),
            len(moved),
        )
        return changed, moved

    def demote(self, cid: int) -> Waiting:
        """Chunk ``cid``, held here, is another server's now: it becomes this server's
        copy if this server is its backup (else it goes), its round in progress is
        dropped, and its replications in flight are taken off. Returns the requests
        that waited on it (pushes of the round in progress, replies held for an ACK):
        each is to be answered *moved*, and resent by its worker to the new owner,
        which holds the chunk as of the last round released (or a later one: a resent
        push of a round applied there is answered, not applied again)."""
        chunk = self.store.chunks.pop(cid)
        waiting: Waiting = [(r.peer, r.rid) for r in chunk.waiting]
        for rid in [r for r, f in self.in_flight.items() if f.chunk == cid]:
            waiting += self.in_flight.pop(rid).waiting
        self._forget_slots(cid)
        chunk.waiting = []
        chunk.arrived.clear()
        chunk.any_grad = chunk.mean_only = False
        chunk.scale = chunk.weight_sum = 0.0
        self._unread.pop(cid, None)  # (none: a copy promoted was read out)
        if self.backup(cid) == self.store.index:
            self.copies[cid] = chunk
        else:
            self.retired[cid] = chunk  # until the next map: see holdings()
        return waiting

    def resync(self, cid: int) -> tuple[list[Release], Waiting]:
        """Take off the replications of chunk ``cid`` in flight (their backup changed):
        their releases and what they answer, to wait on the fresh REPLICATE to the
        new backup."""
        releases: list[Release] = []
        waiting: Waiting = []
        for rid in [r for r, f in self.in_flight.items() if f.chunk == cid]:
            flight = self.in_flight.pop(rid)
            releases += flight.releases
            waiting += flight.waiting
        self._forget_slots(cid)
        return releases, waiting

    def holdings(self) -> dict[int, int]:
        """Each chunk this server holds, owned, as a copy or retired, and the rounds
        applied to the newest of them: for HELD, where a server died while a map was
        being taken and the coordinator looks for each chunk's newest copy. Never
        blocks."""
        rounds: dict[int, int] = {}
        for held in (self.retired, self.copies, self.store.chunks):
            for cid, chunk in held.items():
                rounds[cid] = max(rounds.get(cid, 0), chunk.round)
        return rounds

    def _newest(self, cid: int, retired: dict[int, Chunk]) -> Chunk | None:
        """Chunk ``cid``'s copy here (a backup's, or one ``retired`` by the map before:
        never both, a backup's copy is never retired), taken off; None if neither."""
        copy = self.copies.pop(cid, None)
        return copy if copy is not None else retired.pop(cid, None)

    def _forget_slots(self, cid: int) -> None:
        """Chunk ``cid``'s replications were taken off unacknowledged: which arena its
        backup holds is unknown, so the next one through shared memory goes into new
        arenas (the backup's mapping of these stays valid while it holds them)."""
        self._held_slot.pop(cid, None)
        self.arenas.drop(cid)

    def _read_out(self, cid: int, copy: Chunk) -> None:
        """Copy ``cid`` is promoted: read its last REPLICATE out of its primary's arena
        (if that is where it is), and unmap the arenas mapped for it."""
        unread = self._unread.pop(cid, None)
        if unread is not None:
            _read(copy, *unread)
        self.arenas.unmap(cid)


def _read(
    copy: Chunk, msg: replica.ReplicateHeader, value: torch.Tensor, state: Sequence[memoryview]
) -> None:
    """Set ``copy``'s value and optimizer state to a REPLICATE's (``msg``, read and
    checked; ``value`` and ``state``: its frames). Never blocks or raises."""
    if copy.optimizer is not None:
        decode_state(copy.optimizer, cast(headers.HandoverHeader, msg), state)
    copy.value.copy_(value)


def _check_state(msg: replica.ReplicateHeader, frames: Sequence[memoryview]) -> None:
    """Raise a MALFORMED :class:`ProtocolError` unless each state tensor of ``msg``'s
    ``st`` is ``["t", a wire dtype, a shape]`` whose bytes are its frame's (in order)."""
    rest = iter(frames)
    for key, entry in msg.get("st", {}).items():
        if entry[0] != "t":
            continue
        shape = entry[2] if len(entry) == 3 and isinstance(entry[2], list) else None
        size = DTYPE_SIZES.get(entry[1]) if len(entry) == 3 and isinstance(entry[1], str) else None
        if (
            shape is None
            or size is None
            or entry[1] not in TORCH_DTYPES
            or not all(type(d) is int and d >= 0 for d in shape)
        ):
            raise ProtocolError(ErrorCode.MALFORMED.value, f"REPLICATE: state {key!r} is bad")
        numel = 1
        for d in shape:
            numel *= d
        if next(rest).nbytes != numel * size:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"REPLICATE: state {key!r} has the wrong bytes"
            )
