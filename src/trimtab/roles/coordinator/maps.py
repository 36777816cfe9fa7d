"""The placement map at the coordinator: the workers' declarations, the first placement,
the job's growth by a table per further DistributedOptimizer, the map published after
each migration, and the workers waiting for a newer one. Pure: each operation returns
the messages to send.

A job holds one *table* per DistributedOptimizer a worker builds (a GAN's generator and
discriminator: two), declared by every worker in the same order. The first table's
declarations make the first map; each later one, once every worker declared it, gets
the next chunk ids (its tensors follow the others'), placed over the active servers,
and a new map epoch covering every chunk: each live server is sent EXTEND and holds its
new chunks fresh; once all acknowledged, the declaring workers get the map. Each table
keeps its own ``opt`` (optimizer class, mode, groups), which the job map carries in
``tables``. No table is added while a migration is in flight, nor a migration started
while a table's chunks are being placed (:attr:`Maps.pending`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trimtab.core.chunks import ChunkSpec, PlacementMap, TensorSpec, make_chunks
from trimtab.errors import ProtocolError
from trimtab.policies import replicas
from trimtab.policies.placement import PlacementPolicy
from trimtab.protocol import headers
from trimtab.protocol.headers import JobMapHeader, MapReplyHeader
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.members import Member, Members, Role
from trimtab.roles.coordinator.outbox import Outbox, Refuse, Send
from trimtab.settings import BatchingSettings, ConsistencySettings
from trimtab.transport.base import Peer

log = logging.getLogger("trimtab.coordinator")

#: What a node assumes of a job term the MAP leaves out (see ``read_job_map``): a term
#: not given to :class:`Maps` is sent as this, which means the same to every node.
_TERM_DEFAULTS: dict[str, Any] = {
    "batching": BatchingSettings().policy,
    "consistency": ConsistencySettings().mode,
    "report_s": 0.0,
    "time_servers": False,
    "consistency_args": {},
}


class Maps:
    """The job's placement map and who waits for it. Not thread-safe: the coordinator's
    loop owns it.

    Args:
        placement: the policy that makes the first map.
        chunk_bytes: the largest chunk.
        terms: the job's terms every MAP carries after its placement fields, by the
            keywords of :func:`~trimtab.protocol.headers.job_map` (``batching``,
            ``consistency``, ``report_s``, ``time_servers``, ``consistency_args``); one
            left out is sent as nodes assume it when absent (bsp, equal batches...).
    """

    def __init__(
        self, placement: PlacementPolicy, chunk_bytes: int, terms: Mapping[str, Any]
    ) -> None:
        self._placement = placement
        self._chunk_bytes = chunk_bytes
        self._terms = {**_TERM_DEFAULTS, **terms}
        #: The current map (None until every worker declared and every server joined).
        self.map: PlacementMap | None = None
        #: The job map: every table's tensors and optimizer settings, the job's terms,
        #: and the map as of the first placement or the last table added. A
        #: migration's MIGRATE carries it too, with the new owners.
        self.header: JobMapHeader | None = None
        #: Bytes of each chunk, by chunk id.
        self.sizes: list[int] = []
        #: What MAP_GET answers since the first migration: the map and its cuts (its
        #: ``i`` set per request).
        self.published: MapReplyHeader | None = None
        #: The tables placed so far, in order: the tensors as declared and the ``opt``.
        self.tables: list[tuple[list[Any], dict[str, Any]]] = []
        # The declarations of the next table (number len(tables)), by worker rank.
        self._declared: dict[int, tuple[Peer, int, list[Any], dict[str, Any]]] = {}
        self._awaiting_acks: set[int] = set()
        self._waiters: list[tuple[Peer, int, int]] = []
        #: Backups of each chunk (0 or 1: ``--replicas``), set by the coordinator.
        self.replicas = 0
        #: Each chunk's backup server (-1: none); empty without replicas.
        self.backups: list[int] = []

    @property
    def epoch(self) -> int:
        """The current map's epoch (0 before the first)."""
        return self.map.epoch if self.map else 0

    @property
    def published_epoch(self) -> int:
        """The epoch of the last map a migration published (0 before any)."""
        return self.published["epoch"] if self.published is not None else 0

    @property
    def pending(self) -> bool:
        """Whether a map was sent to the servers and not every one acknowledged it yet
        (the first map, or a new table's): no migration may start meanwhile."""
        return bool(self._awaiting_acks)

    def waiting(self) -> int:
        """How many MAP_GETs wait for a newer map."""
        return len(self._waiters)

    def declare(self, member: Member, header: Header) -> None:
        """Take a worker's DECLARE (its ``tensors`` and ``opt`` of table ``t``); the map
        follows once every worker declared the table (:meth:`place`). Raises
        :class:`ProtocolError`: BAD_STATE from a server or for a table other than the
        next (declared already, or one skipped), MALFORMED for a bad tensor list."""
        if member.role is not Role.WORKER:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "only workers declare tensors")
        declared = headers.read_declare(header)
        table = declared.get("t", 0)
        if table != len(self.tables):
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"worker {member.rank} declared the tensors of its optimizer number {table} "
                f"(from 0), but the job has {len(self.tables)} placed and takes number "
                f"{len(self.tables)} next: every worker must build its DistributedOptimizers "
                "in the same order, each once",
            )
        tensors = declared["tensors"]
        try:
            [TensorSpec.from_wire(t) for t in tensors]
        except ValueError as exc:
            raise ProtocolError(ErrorCode.MALFORMED.value, str(exc)) from None
        self._declared[member.rank] = (member.peer, header["i"], tensors, declared["opt"])

    def again(
        self, member: Member, header: Header, members: Members, clock_of: Callable[[int], int]
    ) -> Outbox:
        """A worker's DECLARE of a table the job has already (it called ``init()`` after
        ``shutdown()`` and built its optimizer again): answered now with the current
        job map and the worker's clock of that table (``clock_of(table)``), from which
        its new optimizer goes on; nothing is placed or seeded again. Returns nothing
        for a DECLARE of a table the job does not have (:meth:`declare` takes it).
        Raises a BAD_STATE :class:`ProtocolError` if the tensors or the optimizer's
        class or mode differ from the table's."""
        if member.role is not Role.WORKER:
            return []  # (declare() refuses it)
        declared = headers.read_declare(header)
        table = declared.get("t", 0)
        if not 0 <= table < len(self.tables) or self.map is None:
            return []
        tensors, opt = self.tables[table]
        theirs = declared["opt"]
        if declared["tensors"] != tensors:
            diff = _first_difference(tensors, declared["tensors"])
            why = f"its tensors differ from the job's (the job's vs its: {diff})"
        elif (theirs.get("cls"), theirs.get("mode")) != (opt.get("cls"), opt.get("mode")):
            why = (
                f"it runs {theirs.get('cls')} in {theirs.get('mode')} mode, the job's runs "
                f"{opt.get('cls')} in {opt.get('mode')} mode"
            )
        else:
            clock = clock_of(table)
            member.floor = max(member.floor, self.epoch)  # it routes by this map now
            log.info(
                "worker %d declared table %d again: goes on at clock %d", member.rank, table, clock
            )
            reply = headers.declared_again(self._job_map(members), rid=header["i"], clock=clock)
            return [Send(member.peer, reply)]
        raise ProtocolError(
            ErrorCode.BAD_STATE.value,
            f"worker {member.rank} built its optimizer number {table} (from 0) again, but "
            f"{why}. After init() following shutdown(), build the same optimizers over the "
            "same parameters, in the same order (the servers hold their values and state)",
        )

    def place(self, members: Members, *, migrating: bool = False) -> Outbox:
        """Make the first map once every worker declared and every server joined, or
        add a table once every worker declared it (and no migration is in flight,
        ``migrating``: retried when it is done): the servers get the map (MAP, or EXTEND)
        now, the workers once every server acknowledged it (:meth:`ack`). Workers that
        declared different tensors are all refused (MISMATCH) and must declare again.
        Returns nothing while not ready."""
        if (
            self._awaiting_acks
            or len(self._declared) < members.num_workers
            or len(members.servers) < members.num_servers
            or (self.map is not None and migrating)
        ):
            return []
        lowest = min(self._declared)
        first = self._declared[lowest]
        for rank, (_, _, tensors, _) in sorted(self._declared.items()):
            if tensors != first[2]:
                diff = _first_difference(first[2], tensors)
                msg = f"worker {rank} declared different tensors than worker {lowest}: {diff}"
                out: Outbox = [
                    Refuse(p, r, ErrorCode.MISMATCH.value, msg)
                    for p, r, _, _ in self._declared.values()
                ]
                self._declared.clear()
                return out
        specs = [TensorSpec.from_wire(t) for t in first[2]]
        chunks = make_chunks(specs, self._chunk_bytes)
        if self.map is not None:
            return self._extend(members, first[2], first[3], specs, chunks)
        self.tables.append((first[2], first[3]))
        self.sizes = [c.nbytes for c in chunks]
        owners = self._placement.place(specs, chunks, len(members.servers))
        self.map = PlacementMap(1, tuple(owners), tuple(m.addr for m in members.servers))
        if self.replicas:
            self.backups = replicas.backups(owners, self.sizes, range(len(members.servers)))
        members.placed(range(len(members.servers)))
        self.header = self._job_map(members)
        log.info(
            "placed %d tensors in %d chunks over %d servers (%s)",
            len(specs),
            len(chunks),
            len(members.servers),
            self._placement.name,
        )
        self._awaiting_acks = {m.rank for m in members.servers}
        return [Send(m.peer, {**self.header, "i": 0}) for m in members.servers]

    def _extend(
        self,
        members: Members,
        tensors: list[Any],
        opt: dict[str, Any],
        specs: list[TensorSpec],
        chunks: list[ChunkSpec],
    ) -> Outbox:
        """Add the table every worker declared (``tensors``, ``opt``; ``specs`` and
        ``chunks`` cut from them, ids from 0): its chunks take the ids after the
        others', placed by the policy over the active servers, under a new epoch. Every
        live server is sent EXTEND; returns nothing if no server is active (retried at
        the next placement)."""
        current = self.map
        active = members.active_servers()
        if current is None or not active:
            return []
        local = self._placement.place(specs, chunks, len(active))
        added = tuple(active[o].rank for o in local)
        owners = current.owners + added
        servers = tuple(m.addr for m in members.servers)
        self.map = PlacementMap(current.epoch + 1, owners, servers)
        self.tables.append((tensors, opt))
        self.sizes = self.sizes + [c.nbytes for c in chunks]
        if self.replicas:
            ranks = [m.rank for m in active]
            self.backups = replicas.backups(owners, self.sizes, ranks, self.backups)
        members.placed(added)
        self.header = self._job_map(members)
        if self.published is not None:
            # Chunks moved before keep their cuts (moot now: every worker pushed past
            # them); the new ones never moved.
            prev = self.published["prev"]
            self.published = headers.map_reply(
                rid=0,
                epoch=self.map.epoch,
                owners=list(owners),
                servers=list(servers),
                prev=[*prev, *owners[len(prev) :]],
                cuts=self.published["cuts"],
            )
        log.info(
            "table %d: %d tensors in %d chunks (ids %d..%d) over servers %s, map epoch %d",
            len(self.tables) - 1,
            len(specs),
            len(chunks),
            len(current.owners),
            len(owners) - 1,
            sorted(set(added)),
            self.map.epoch,
        )
        live = [m for m in members.servers if not m.finished]
        self._awaiting_acks = {m.rank for m in live}
        extend = headers.extend(job_map=self.header)
        return [Send(m.peer, extend) for m in live]

    def restore(
        self,
        tables: Sequence[tuple[list[Any], dict[str, Any]]],
        saved: Mapping[str, Any],
        members: Members,
    ) -> Outbox:
        """A resumed job's first map: a checkpoint's ``tables`` (tensors as declared, and
        ``opt``, in order) and its map ``saved`` (``PlacementMap.to_dict``; its owners
        kept if every one is a server the job has now, else the chunks placed afresh by
        the policy), under the next epoch. Every server is sent MAP; workers' DECLAREs of
        these tables are then answered by :meth:`again`. Raises :class:`ConfigError` for
        a malformed ``saved``."""
        tensors = [t for table, _ in tables for t in table]
        specs = [TensorSpec.from_wire(t) for t in tensors]
        chunks = make_chunks(specs, self._chunk_bytes)
        servers = tuple(m.addr for m in members.servers)
        epoch = int(saved.get("epoch", 0)) + 1
        owners = list(saved.get("owners", []))
        if len(owners) == len(chunks) and all(0 <= o < len(servers) for o in owners):
            self.map = PlacementMap.from_dict(saved, epoch=epoch, servers=servers)
        else:
            owners = self._placement.place(specs, chunks, len(servers))
            self.map = PlacementMap(epoch, tuple(owners), servers)
        self.tables = [(list(t), dict(o)) for t, o in tables]
        self.sizes = [c.nbytes for c in chunks]
        members.placed(range(len(servers)))
        self.header = self._job_map(members)
        self._awaiting_acks = {m.rank for m in members.servers}
        return [Send(m.peer, {**self.header, "i": 0}) for m in members.servers]

    def take_part(self, ranks: list[int]) -> None:
        """The workers taking part are ``ranks`` now (an elastic job lost or added one):
        the job map says so from now on (a server joining later learns them from it)."""
        if self.header is not None:
            self.header["workers"] = list(ranks)

    def rebuild(self, job_map: JobMapHeader, members: Members) -> None:
        """A replacement coordinator's map (:mod:`.rejoin`): the servers' ``job_map`` as
        it stands (its tables, owners, backups and epoch), which every server holds
        already: nothing is sent. ``members`` are laid out already. Raises a MALFORMED
        :class:`ProtocolError` for tables that do not cover the tensors."""
        tables = headers.read_tables(job_map)
        tensors = list(job_map["tensors"])
        self.tables, first = [], 0
        for count, opt in tables:
            self.tables.append((tensors[first : first + count], dict(opt)))
            first += count
        specs = [TensorSpec.from_wire(t) for t in tensors]
        self.sizes = [c.nbytes for c in make_chunks(specs, job_map["chunk_bytes"])]
        owners = tuple(job_map["owners"])
        self.map = PlacementMap(job_map["epoch"], owners, tuple(job_map["servers"]))
        self.backups = list(job_map.get("bk", [])) if self.replicas else []
        self.header = self._job_map(members)

    def _job_map(self, members: Members) -> JobMapHeader:
        """The job map of the current map and every table (MAP's header, without ``i``)."""
        assert self.map is not None
        tables = self.tables
        header = headers.job_map(
            epoch=self.map.epoch,
            tensors=[t for tensors, _ in tables for t in tensors],
            chunk_bytes=self._chunk_bytes,
            owners=list(self.map.owners),
            servers=list(self.map.servers),
            opt=tables[0][1],
            workers=members.taking_part(),
            **self._terms,
            tables=[[len(t), o] for t, o in tables] if len(tables) > 1 else None,
        )
        if self.backups:
            header["bk"] = list(self.backups)
        return header

    def ack(self, rank: int, members: Members) -> Outbox:
        """Server ``rank`` holds its chunks of the map (the first, or a new table's);
        once every server does, the declaring workers get the map (their routing floor
        starts there), and MAP_GETs waiting for its epoch are answered."""
        self._awaiting_acks.discard(rank)
        if self._awaiting_acks or self.header is None or not self._declared:
            return []
        out: Outbox = []
        for peer, rid, _, _ in self._declared.values():
            out.append(Send(peer, {**self.header, "i": rid}))
            members.by_peer[peer].floor = self.header["epoch"]
        self._declared.clear()
        return out + self._answer()

    def want(self, peer: Peer, rid: int, epoch: int) -> Outbox:
        """A MAP_GET for a map of at least ``epoch``: answered now if published, else
        when a migration publishes one."""
        self._waiters.append((peer, rid, epoch))
        return self._answer()

    def publish(
        self, epoch: int, owners: tuple[int, ...], servers: Sequence[str], cuts: Mapping[int, int]
    ) -> Outbox:
        """Every server acknowledged migration ``epoch``: its map is the current one,
        with the clock from which each moving chunk is its new owner's (``cuts``).
        Returns the answers to the MAP_GETs it satisfies."""
        previous = self.map.owners if self.map else ()
        self.map = PlacementMap(epoch, owners, tuple(servers))
        self.published = headers.map_reply(
            rid=0,
            epoch=epoch,
            owners=list(owners),
            servers=list(self.map.servers),
            prev=list(previous),
            cuts={str(c): k for c, k in cuts.items()},
        )
        return self._answer()

    def _answer(self) -> Outbox:
        published = self.published_epoch or self.epoch
        keep = []
        out: Outbox = []
        for peer, rid, epoch in self._waiters:
            if epoch > published:
                keep.append((peer, rid, epoch))
                continue
            out.append(Send(peer, self._map_reply(rid)))
        self._waiters = keep
        return out

    def _map_reply(self, rid: int) -> MapReplyHeader:
        """MAP answering request ``rid``: the published map, or the first (no cuts)."""
        if self.published is not None:
            reply = self.published.copy()
            reply["i"] = rid  # keeps its place, second: the same bytes as a new reply
            return reply
        current = self.map
        return headers.map_reply(
            rid=rid,
            epoch=self.epoch,
            owners=list(current.owners) if current else [],
            servers=list(current.servers) if current else [],
            prev=[],
            cuts={},
        )


def _first_difference(a: list[Any], b: list[Any]) -> str:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return f"{x} vs {y}"
    return f"{len(a)} tensors vs {len(b)}"
