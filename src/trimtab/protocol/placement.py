"""Control-plane headers about the placement map: tensors declared, maps published and
changed (migration), the map asked for. What the policies measure (step and load
reports) is in :mod:`trimtab.protocol.reports`.

As in :mod:`trimtab.protocol.control`: builders return the literal the roles built
before (the same msgpack bytes) and check nothing; readers check a received header with
:func:`~trimtab.protocol.messages.field` and return it typed, or raise
``ProtocolError(ErrorCode.MALFORMED.value, ...)``. None blocks; all are thread-safe.
What each short key means is in :mod:`trimtab.protocol.headers`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import (
    NUMBER,
    Control,
    ErrorCode,
    Header,
    KeySpec,
    WireHeader,
    field,
    fields,
    int_list,
)

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

_DECLARE = int(Control.DECLARE)
_MAP = int(Control.MAP)
_MAP_ACK = int(Control.MAP_ACK)
_MIGRATE = int(Control.MIGRATE)
_MIGRATE_ACK = int(Control.MIGRATE_ACK)
_HANDED = int(Control.HANDED)
_MAP_GET = int(Control.MAP_GET)
_EXTEND = int(Control.EXTEND)

# -- the first map ------------------------------------------------------------------


class DeclareHeader(WireHeader):
    """DECLARE, worker -> coordinator: the tensors of one optimizer (a *table*) to
    train; answered MAP (the job map, every table so far) once every worker declared the
    same and every server acknowledged its chunks."""

    tensors: list[list[Any]]  # TensorSpec.to_wire() of each: [name, shape, dtype, group]
    opt: dict[str, Any]  # the optimizer: mode, cls, per-group hyperparameters
    t: NotRequired[int]  # the table: this worker's n-th optimizer, from 0 (absent: 0)


def declare(*, tensors: list[list[Any]], opt: dict[str, Any], table: int = 0) -> DeclareHeader:
    """``table`` 0 (the first optimizer) leaves ``t`` out."""
    header: DeclareHeader = {"o": _DECLARE, "tensors": tensors, "opt": opt}
    if table:
        header["t"] = table
    return header


def read_declare(header: Header) -> DeclareHeader:
    """Checks that ``tensors`` is a list, ``opt`` a map and ``t`` an int if present;
    each tensor spec is the caller's to parse (``TensorSpec.from_wire``)."""
    fields(header, (("tensors", list), ("opt", dict)), (("t", int),))
    return cast(DeclareHeader, header)


class JobMapHeader(WireHeader):
    """MAP, coordinator -> servers (then answered MAP_ACK) and -> each declaring worker
    (the reply to DECLARE): the first map, with all a node needs to know of the job.
    The coordinator builds it once and sends ``{**header, "i": rid}`` to each."""

    epoch: int  # the map's epoch (1)
    tensors: list[list[Any]]  # as declared
    chunk_bytes: int
    owners: list[int]  # chunk id -> server rank
    servers: list[str]  # server rank -> address
    opt: dict[str, Any]  # as declared
    workers: list[int]  # the workers' ranks
    batching: str  # the batch-sizing policy's name
    consistency: str  # the consistency policy's name
    report_s: float  # a worker reports its steps at most this often (0: every step)
    time_servers: bool  # whether workers time each server (a live placement reads it)
    consistency_args: dict[str, Any]  # e.g. staleness for ssp
    # With more than one table (DistributedOptimizer): per table, in declaration order,
    # [its tensor count, its opt]; ``tensors`` lists every table's, ``opt`` is table 0's.
    # Absent: one table of every tensor, under ``opt`` (see :func:`read_tables`).
    tables: NotRequired[list[list[Any]]]
    # Only in the reply to a DECLARE of a table the job has already (a worker that
    # called init() again): the worker's clock of that table, from which it goes on.
    k: NotRequired[int]
    # An elastic job (workers may be lost or join, bsp): each step ends at the step
    # boundary; and, to a worker that joined a running job, every rank's first sizes.
    elastic: NotRequired[bool]
    sizes: NotRequired[list[int]]
    # With replicas: each chunk's backup server (-1: none); see protocol.replica.
    bk: NotRequired[list[int]]


def job_map(
    *,
    epoch: int,
    tensors: list[list[Any]],
    chunk_bytes: int,
    owners: list[int],
    servers: list[str],
    opt: dict[str, Any],
    workers: list[int],
    batching: str,
    consistency: str,
    report_s: float,
    time_servers: bool,
    consistency_args: dict[str, Any],
    tables: list[list[Any]] | None = None,
    elastic: bool = False,
) -> JobMapHeader:
    """``tables`` (None with one table) is added last, only when given; ``elastic``
    only when true."""
    header: JobMapHeader = {
        "o": _MAP,
        "epoch": epoch,
        "tensors": tensors,
        "chunk_bytes": chunk_bytes,
        "owners": owners,
        "servers": servers,
        "opt": opt,
        "workers": workers,
        "batching": batching,
        "consistency": consistency,
        "report_s": report_s,
        "time_servers": time_servers,
        "consistency_args": consistency_args,
    }
    if tables is not None:
        header["tables"] = tables
    if elastic:
        header["elastic"] = True
    return header


_JOB_MAP_KEYS: KeySpec = (
    ("epoch", int),
    ("tensors", list),
    ("chunk_bytes", int),
    ("owners", list),
    ("servers", list),
    ("opt", dict),
    ("workers", list),
)
# A node reads these with a default (bsp, equal, ...) where they are absent.
_JOB_MAP_OPTIONAL: KeySpec = (
    ("batching", str),
    ("consistency", str),
    ("report_s", NUMBER),
    ("time_servers", bool),
    ("consistency_args", dict),
    ("tables", list),
    ("k", int),
    ("elastic", bool),
    ("sizes", list),
    ("bk", list),
)


def declared_again(job_map: JobMapHeader, *, rid: int, clock: int) -> JobMapHeader:
    """The reply to a worker's DECLARE of a table the job already has (``init()`` after
    ``shutdown()``): the job map ``job_map`` with the worker's ``clock`` of that table."""
    return {**job_map, "i": rid, "k": clock}


def read_job_map(header: Header) -> JobMapHeader:
    fields(header, _JOB_MAP_KEYS, _JOB_MAP_OPTIONAL)
    return cast(JobMapHeader, header)


def read_tables(header: JobMapHeader) -> list[tuple[int, dict[str, Any]]]:
    """A read job map's tables: per table, in order, its tensor count and its ``opt``
    (one table of every tensor under ``opt`` when ``tables`` is absent). Raises a
    MALFORMED :class:`ProtocolError` unless each is ``[count, map]`` and the counts add
    up to the tensors' (or for a header that is no job map)."""
    read_job_map(cast(Header, header))  # a header not read yet (one field check)
    raw = header.get("tables")
    if raw is None:
        return [(len(header["tensors"]), header["opt"])]
    tables: list[tuple[int, dict[str, Any]]] = []
    for entry in raw:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and type(entry[0]) is int
            and entry[0] >= 0
            and isinstance(entry[1], dict)
        ):
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"a table {entry!r} is not [tensor count, opt]"
            )
        tables.append((entry[0], entry[1]))
    if sum(n for n, _ in tables) != len(header["tensors"]):
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            f"the tables count {sum(n for n, _ in tables)} tensors, the map lists "
            f"{len(header['tensors'])}",
        )
    return tables


class ExtendHeader(JobMapHeader):
    """EXTEND, coordinator -> every live server: the job grew by a table (another
    DistributedOptimizer): the job map's keys with every table, a new ``epoch`` and the
    ``owners`` of every chunk (the new table's chunks follow the others' ids). A server
    holds, fresh, the new chunks given it; answered MAP_ACK."""


def extend(*, job_map: JobMapHeader) -> ExtendHeader:
    """``job_map``: the job map with the new table (without ``i``)."""
    return {**job_map, "o": _EXTEND, "i": 0}


def read_extend(header: Header) -> ExtendHeader:
    fields(header, _JOB_MAP_KEYS, _JOB_MAP_OPTIONAL)
    return cast(ExtendHeader, header)


class MapAckHeader(WireHeader):
    """MAP_ACK, server -> coordinator: it holds the chunks the first map gives it."""

    epoch: int  # the map it took


def map_ack(*, rid: int, epoch: int) -> MapAckHeader:
    return {"o": _MAP_ACK, "i": rid, "epoch": epoch}


def read_map_ack(header: Header) -> MapAckHeader:
    field(header, "epoch", int)
    return cast(MapAckHeader, header)


# -- migration ----------------------------------------------------------------------


class MigrateHeader(JobMapHeader):
    """MIGRATE, coordinator -> every live server: a new map (the job map's keys, with a
    new ``epoch``, ``owners`` and ``servers``); answered MIGRATE_ACK."""


def migrate(
    *, job_map: JobMapHeader, epoch: int, owners: list[int], servers: list[str]
) -> MigrateHeader:
    """``job_map`` is the first map's header (without ``i``): its keys keep their order,
    ``i`` comes last, as the coordinator's ``{**map_header, ...}`` did."""
    return {
        **job_map,
        "o": _MIGRATE,
        "i": 0,
        "epoch": epoch,
        "owners": owners,
        "servers": servers,
    }


def read_migrate(header: Header) -> MigrateHeader:
    fields(header, _JOB_MAP_KEYS, _JOB_MAP_OPTIONAL)
    return cast(MigrateHeader, header)


class MigrateAckHeader(WireHeader):
    """MIGRATE_ACK, server -> coordinator: it took the new map."""

    epoch: int  # the new map's
    cuts: dict[str, int]  # chunk id (str) -> the clock from which its new owner has it


def migrate_ack(*, epoch: int, cuts: dict[str, int]) -> MigrateAckHeader:
    return {"o": _MIGRATE_ACK, "i": 0, "epoch": epoch, "cuts": cuts}


def read_migrate_ack(header: Header) -> MigrateAckHeader:
    """Checks ``epoch``, and that ``cuts`` maps chunk ids (decimal strings) to ints."""
    field(header, "epoch", int)
    cuts = field(header, "cuts", dict)
    for cid, cut in cuts.items():
        if not (isinstance(cid, str) and cid.isdigit() and type(cut) is int):
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"a cut {cid!r}: {cut!r} is not chunk id: clock"
            )
    return cast(MigrateAckHeader, header)


class HandedHeader(WireHeader):
    """HANDED, server -> coordinator: these chunks reached their new owners."""

    epoch: int  # the map the server holds
    c: list[int]  # chunk ids


def handed(*, epoch: int, chunks: list[int]) -> HandedHeader:
    return {"o": _HANDED, "i": 0, "epoch": epoch, "c": chunks}


def read_handed(header: Header) -> HandedHeader:
    field(header, "epoch", int)
    int_list(header, "c")
    return cast(HandedHeader, header)


class MapGetHeader(WireHeader):
    """MAP_GET, worker -> coordinator: answered :func:`map_reply` once a map of at
    least epoch ``e`` is published."""

    e: int  # the epoch wanted (a MOVED reply's)
    lo: NotRequired[int]  # the worker's routing floor


def map_get(*, epoch: int, floor: int) -> MapGetHeader:
    return {"o": _MAP_GET, "e": epoch, "lo": floor}


def read_map_get(header: Header) -> MapGetHeader:
    """Checks ``e``, and ``lo`` if present."""
    fields(header, (("e", int),), (("lo", int),))
    return cast(MapGetHeader, header)


class MapReplyHeader(WireHeader):
    """MAP answering MAP_GET: the published map, and where each moving chunk is cut."""

    epoch: int
    owners: list[int]  # chunk id -> server rank
    servers: list[str]  # server rank -> address
    prev: list[int]  # the owners before this map (empty for the first map)
    cuts: dict[str, int]  # chunk id (str) -> clock from which ``owners`` holds for it


def map_reply(
    *,
    rid: int,
    epoch: int,
    owners: list[int],
    servers: list[str],
    prev: list[int],
    cuts: dict[str, int],
) -> MapReplyHeader:
    return {
        "o": _MAP,
        "i": rid,
        "epoch": epoch,
        "owners": owners,
        "servers": servers,
        "prev": prev,
        "cuts": cuts,
    }


_MAP_REPLY_KEYS: KeySpec = (
    ("epoch", int),
    ("owners", list),
    ("servers", list),
    ("prev", list),
    ("cuts", dict),
)


def read_map_reply(header: Header) -> MapReplyHeader:
    fields(header, _MAP_REPLY_KEYS)
    return cast(MapReplyHeader, header)
