"""The migration protocol as pure operations: each takes the migration in flight and a
message, and returns the new state (and the messages to send). The coordinator runs at
most one migration at a time.

1. :func:`start`: every live server gets MIGRATE (the new owners under a new epoch).
2. :func:`ack`: each answers MIGRATE_ACK with the clock from which each chunk it gives
   away is its new owner's (its *cut*). Once all have, the coordinator publishes the
   map and its cuts to the workers (:meth:`Maps.publish`).
3. :func:`handed`: servers say HANDED as chunks reach their new owners.
4. The migration is :attr:`Migration.done` once every server acknowledged and every
   moving chunk was handed over; then draining servers may retire.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from trimtab.core.chunks import PlacementMap
from trimtab.errors import ProtocolError, UsageError
from trimtab.protocol import headers
from trimtab.protocol.headers import JobMapHeader
from trimtab.protocol.messages import ErrorCode, Header, error_of, field
from trimtab.roles.coordinator.members import Member
from trimtab.roles.coordinator.outbox import Outbox, Send


@dataclasses.dataclass(frozen=True)
class Migration:
    """A migration in flight.

    Attributes:
        epoch: the new map's epoch.
        owners: the new owner of every chunk.
        acks: servers still to acknowledge the new map.
        cuts: chunk -> the clock from which its new owner holds it (from the acks).
        moving: chunks not yet handed over to their new owners.
        backups: each chunk's backup in the new map (empty without replicas: then no
            chunk is handed over, roles move: see :func:`trimtab.policies.replicas.
            role_moves`).
    """

    epoch: int
    owners: tuple[int, ...]
    acks: frozenset[int]
    cuts: Mapping[int, int]
    moving: frozenset[int]
    backups: tuple[int, ...] = ()

    @property
    def acked(self) -> bool:
        """Every server acknowledged: the map can be published."""
        return not self.acks

    @property
    def done(self) -> bool:
        """Acknowledged and every moving chunk handed over."""
        return not self.acks and not self.moving


def start(
    in_flight: Migration | None,
    current: PlacementMap | None,
    base: JobMapHeader | None,
    owners: Sequence[int],
    servers: Sequence[Member],
    backups: Sequence[int] = (),
) -> tuple[Migration, Outbox]:
    """Begin moving chunks from ``current`` to ``owners``: MIGRATE (``base``, the first
    MAP's header, with the new epoch, owners and server addresses) to every server not
    retired, each of which must acknowledge. With ``backups`` (a job with replicas), the
    MIGRATE carries them and nothing is handed over. Raises :class:`UsageError` if no map exists
    yet, a migration is in flight, or ``owners`` does not give every chunk to a server
    of ``servers`` that is not retired."""
    if current is None or base is None:
        raise UsageError("no placement yet: tensors are not declared")
    if in_flight is not None:
        raise UsageError(f"migration to epoch {in_flight.epoch} still in flight")
    if len(owners) != len(current.owners) or not all(0 <= o < len(servers) for o in owners):
        raise UsageError("a new map must name a live server for every chunk")
    if any(servers[o].finished for o in owners):
        raise UsageError("a new map gives chunks to a retired server")
    epoch = current.epoch + 1
    moving = frozenset(
        c for c, (a, b) in enumerate(zip(current.owners, owners, strict=True)) if a != b
    )
    live = [m for m in servers if not m.finished]
    acks = frozenset(m.rank for m in live)
    migration = Migration(
        epoch, tuple(owners), acks, {}, frozenset() if backups else moving, tuple(backups)
    )
    header = headers.migrate(
        job_map=base, epoch=epoch, owners=list(owners), servers=[m.addr for m in servers]
    )
    if backups:
        header["bk"] = list(backups)
    return migration, [Send(m.peer, header) for m in live]


def ack(migration: Migration | None, rank: int, header: Header) -> Migration:
    """Server ``rank``'s MIGRATE_ACK (``epoch``, ``cuts``: chunk id -> clock). A repeated
    ack changes nothing. Raises :class:`ProtocolError`: BAD_STATE if no migration to that
    epoch is in flight, MALFORMED for a missing epoch or bad cuts."""
    if migration is None:
        raise ProtocolError(ErrorCode.BAD_STATE.value, "no such migration in flight")
    try:
        acked = headers.read_migrate_ack(header)
    except ProtocolError as exc:
        raise ProtocolError(
            ErrorCode.MALFORMED.value, f"bad cuts or epoch in MIGRATE_ACK: {error_of(exc)[1]}"
        ) from None
    if acked["epoch"] != migration.epoch:
        raise ProtocolError(ErrorCode.BAD_STATE.value, "no such migration in flight")
    cuts = dict(migration.cuts)
    for cid, cut in acked["cuts"].items():
        cuts[int(cid)] = cut  # the reader checked each id a decimal string
    return dataclasses.replace(migration, acks=migration.acks - {rank}, cuts=cuts)


def handed(
    migration: Migration | None, header: Header, sizes: Sequence[int]
) -> tuple[Migration, int]:
    """A server's HANDED (``c``: chunk ids that reached their new owners). Returns the
    new state and the bytes newly handed over (a chunk said twice counts once). Raises
    a BAD_STATE :class:`ProtocolError` if no migration is in flight, MALFORMED for a
    bad chunk list."""
    if migration is None:
        raise ProtocolError(ErrorCode.BAD_STATE.value, "no migration in flight")
    chunks = field(header, "c", list)
    if not all(isinstance(c, int) for c in chunks):
        raise ProtocolError(ErrorCode.MALFORMED.value, "HANDED: chunk ids must be integers")
    arrived = migration.moving.intersection(chunks)
    moved = sum(sizes[c] for c in arrived)
    return dataclasses.replace(migration, moving=migration.moving - arrived), moved
