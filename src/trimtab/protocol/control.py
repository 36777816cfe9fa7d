"""Control-plane headers: one typed header, one builder and (for what a node receives)
one reader per message to or from the coordinator.

Each builder returns the very dict the roles built as a literal before these existed
(same keys, in the same order, with the same types: the same msgpack bytes), and checks
nothing. Each reader checks a received header with :func:`~trimtab.protocol.messages.field`
and returns it typed, or raises ``ProtocolError(ErrorCode.MALFORMED.value, ...)``. None of
them blocks; all are thread-safe (they touch only their arguments).

What each short key means, message by message, is in :mod:`trimtab.protocol.headers`.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    optional,
)

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

_REGISTER = int(Control.REGISTER)
_REGISTERED = int(Control.REGISTERED)
_HEARTBEAT = int(Control.HEARTBEAT)
_BARRIER = int(Control.BARRIER)
_BCAST_PUT = int(Control.BCAST_PUT)
_BCAST_GET = int(Control.BCAST_GET)
_BCAST_VALUE = int(Control.BCAST_VALUE)
_DONE = int(Control.DONE)
_LEAVE = int(Control.LEAVE)
_SHUTDOWN = int(Control.SHUTDOWN)
_ABORT = int(Control.ABORT)
_OK = int(Control.OK)
_STATUS = int(Control.STATUS)
_SCALE = int(Control.SCALE)
_ADOPT = int(Control.ADOPT)

# -- membership ----------------------------------------------------------------------


class RegisterHeader(WireHeader):
    """REGISTER, node -> coordinator: join the job; answered REGISTERED."""

    role: str  # "server" or "worker"
    addr: NotRequired[str]  # a server's: where workers reach it
    rank: NotRequired[Any]  # a worker's wish; not an int >= 0: any free rank
    tk: NotRequired[bytes]  # a server's join ticket (credentials.join_ticket)


def register_server(*, rid: int, addr: str, ticket: bytes | None = None) -> RegisterHeader:
    """A server's REGISTER (sent by the server itself, so it carries its ``rid``);
    ``ticket`` proves the launcher started it (needed to join a running job)."""
    header: RegisterHeader = {"o": _REGISTER, "i": rid, "role": "server", "addr": addr}
    if ticket is not None:
        header["tk"] = ticket
    return header


def register_worker(*, rank: int) -> RegisterHeader:
    """A worker's REGISTER; ``rank`` -1 lets the coordinator choose."""
    return {"o": _REGISTER, "role": "worker", "rank": rank}


def read_register(header: Header) -> RegisterHeader:
    """Checks ``role``, and a server's ``addr`` and ``tk`` (bytes, if present). ``rank``
    is left as sent: anything but an int >= 0 asks for any free rank."""
    if field(header, "role", str) == "server":
        field(header, "addr", str)
        optional(header, "tk", bytes)
    return cast(RegisterHeader, header)


class RegisteredHeader(WireHeader):
    """REGISTERED, coordinator -> node: the reply to REGISTER."""

    rank: int  # the node's rank among its role
    num_workers: int
    num_servers: int  # the servers the job starts with
    chunk_bytes: int  # the largest chunk
    heartbeat_s: float  # how often nodes send HEARTBEAT
    t: NotRequired[bytes]  # the node's credential for its role and rank
    key: NotRequired[bytes]  # a server's: the job's member key, to check credentials


def registered(
    *,
    rid: int,
    rank: int,
    num_workers: int,
    num_servers: int,
    chunk_bytes: int,
    heartbeat_s: float,
    token: bytes | None = None,
    key: bytes | None = None,
) -> RegisteredHeader:
    header: RegisteredHeader = {
        "o": _REGISTERED,
        "i": rid,
        "rank": rank,
        "num_workers": num_workers,
        "num_servers": num_servers,
        "chunk_bytes": chunk_bytes,
        "heartbeat_s": heartbeat_s,
    }
    if token is not None:
        header["t"] = token
    if key is not None:
        header["key"] = key
    return header


_REGISTERED_KEYS: KeySpec = (
    ("rank", int),
    ("num_workers", int),
    ("num_servers", int),
    ("chunk_bytes", int),
    ("heartbeat_s", NUMBER),
)


def read_registered(header: Header) -> RegisteredHeader:
    fields(header, _REGISTERED_KEYS, (("t", bytes), ("key", bytes)))
    return cast(RegisteredHeader, header)


class HeartbeatHeader(WireHeader):
    """HEARTBEAT, node -> coordinator (and the coordinator's echo): I am alive."""

    lo: NotRequired[int]  # a worker's routing floor (see the key legend)
    ts: NotRequired[float]  # the sender's clock as it sent it (s), echoed back
    tn: NotRequired[float]  # in the echo: the coordinator's clock as it answered (s)


def heartbeat(*, sent: float | None = None) -> HeartbeatHeader:
    """A server's heartbeat (``sent``: its clock, for the trace's clock sync)."""
    header: HeartbeatHeader = {"o": _HEARTBEAT, "i": 0}
    if sent is not None:
        header["ts"] = sent
    return header


def heartbeat_echo(beat: Header, now: float) -> HeartbeatHeader:
    """The coordinator's echo of ``beat``: its ``ts`` back (if a number) and ``now``, the
    coordinator's clock: one round trip of NTP's arithmetic (:mod:`trimtab.runtime.trace`)."""
    header: HeartbeatHeader = {"o": _HEARTBEAT, "i": 0}
    sent = beat.get("ts")
    if isinstance(sent, float):
        header["ts"], header["tn"] = sent, now
    return header


def read_clock(header: Header) -> tuple[float, float] | None:
    """An echo's (``ts``, ``tn``), or None where it carries no valid pair."""
    sent, stamped = header.get("ts"), header.get("tn")
    if isinstance(sent, float) and isinstance(stamped, float):
        return sent, stamped
    return None


def worker_heartbeat(*, job: str, floor: int | None, sent: float | None = None) -> HeartbeatHeader:
    """A worker's heartbeat: its I/O thread sends it directly, ``j`` before ``lo``;
    ``floor`` None (no map yet) leaves ``lo`` out; ``sent`` as :func:`heartbeat`."""
    header: HeartbeatHeader = {"o": _HEARTBEAT, "i": 0, "j": job}
    if floor is not None:
        header["lo"] = floor
    if sent is not None:
        header["ts"] = sent
    return header


def read_floor(header: Header) -> int | None:
    """The routing floor ``lo`` of a HEARTBEAT, MAP_GET or REPORT, or None if absent."""
    return cast(int | None, optional(header, "lo", int))


class DoneHeader(WireHeader):
    """DONE, worker -> coordinator: my process ends (it may have sent LEAVE before);
    answered OK. The job ends once every worker said DONE. With ``why``, the process
    ends because it failed (an uncaught exception): the worker is lost, not done."""

    why: NotRequired[str]  # the failure, e.g. ``ValueError: bad batch``


#: The longest failure a DONE carries (the rest is cut: the worker's own output has it).
DONE_WHY_CHARS = 500


def done(*, failed: str | None = None) -> DoneHeader:
    if failed is None:
        return {"o": _DONE}
    return {"o": _DONE, "why": failed[:DONE_WHY_CHARS]}


def read_done(header: Header) -> str | None:
    """The failure a DONE reports, or None for a process that ended normally. Raises
    a MALFORMED :class:`ProtocolError` if ``why`` is not a string."""
    why = optional(header, "why", str)
    return None if why is None else str(why)[:DONE_WHY_CHARS]


class LeaveHeader(WireHeader):
    """LEAVE, worker -> coordinator: ``shutdown()``: this worker steps out of the job
    but keeps its rank and its connection (heartbeats), and may register again
    (``init()``) to go on from its clocks; answered OK. DONE follows at its process's
    end."""

    k: list[int]  # each table's clock (the worker's n-th optimizer's steps), by table


def leave(*, clocks: list[int]) -> LeaveHeader:
    return {"o": _LEAVE, "k": clocks}


def read_leave(header: Header) -> LeaveHeader:
    """Checks that ``k`` is a list of ints (each >= 0)."""
    clocks = int_list(header, "k")
    if any(k < 0 for k in clocks):
        raise ProtocolError(ErrorCode.MALFORMED.value, f"LEAVE: a negative clock in {clocks}")
    return cast(LeaveHeader, header)


class ShutdownHeader(WireHeader):
    """SHUTDOWN, coordinator -> node: the job ended normally (or this server retires)."""


def shutdown() -> ShutdownHeader:
    return {"o": _SHUTDOWN, "i": 0}


class AbortHeader(WireHeader):
    """ABORT, coordinator -> node: the job failed; exit."""

    why: str


def abort(*, why: str) -> AbortHeader:
    return {"o": _ABORT, "i": 0, "why": why}


def read_abort(header: Header) -> AbortHeader:
    field(header, "why", str)
    return cast(AbortHeader, header)


class OkHeader(WireHeader):
    """OK, coordinator -> node: a request done (DONE, BARRIER, BCAST_PUT)."""


def ok(*, rid: int) -> OkHeader:
    return {"o": _OK, "i": rid}


# -- status and scaling (tools) --------------------------------------------------------


class StatusHeader(WireHeader):
    """STATUS, anyone -> coordinator (no REGISTER needed); answered by :func:`status_reply`."""


def status_request() -> StatusHeader:
    return {"o": _STATUS}


class StatusReplyHeader(WireHeader):
    """OK answering STATUS: ``Coordinator.status()``, spread into the header."""

    servers: list[str]  # every server ever registered, by rank: its address
    workers: list[int]
    done: list[int]  # workers whose process ended (DONE)
    left: NotRequired[list[int]]  # workers that called shutdown() and may init() again
    epoch: int  # the current map's
    owners: list[int]  # chunk id -> server rank
    clocks: dict[str, int]  # worker rank -> its clock (steps reported)
    migrations: int
    bytes_moved: int
    active_servers: list[int]
    live_servers: list[int]  # not retired (active or draining)
    wanted_servers: int  # how many server processes the launcher should keep
    migrating: bool
    speeds: list[float]
    worker_speeds: list[list[float | None] | None]
    backups: NotRequired[list[int]]  # chunk id -> its backup's rank (-1: none); replicas
    unbacked: NotRequired[int]  # chunks held once (no backup on a live server)
    failovers: NotRequired[int]  # failovers completed


def status_reply(*, rid: int, status: Mapping[str, Any]) -> StatusReplyHeader:
    """``status`` is ``Coordinator.status()``, with the keys of :class:`StatusReplyHeader`."""
    return cast(StatusReplyHeader, {"o": _OK, "i": rid, **status})


_STATUS_KEYS: KeySpec = (
    ("servers", list),
    ("workers", list),
    ("done", list),
    ("epoch", int),
    ("owners", list),
    ("clocks", dict),
    ("migrations", int),
    ("bytes_moved", int),
    ("active_servers", list),
    ("live_servers", list),
    ("wanted_servers", int),
    ("migrating", bool),
    ("speeds", list),
    ("worker_speeds", list),
)


def read_status_reply(header: Header) -> StatusReplyHeader:
    fields(
        header,
        _STATUS_KEYS,
        (("left", list), ("backups", list), ("unbacked", int), ("failovers", int)),
    )
    return cast(StatusReplyHeader, header)


class ScaleHeader(WireHeader):
    """SCALE, tool -> coordinator: go to this many servers; answered :func:`scale_reply`."""

    servers: int


def scale(*, servers: int) -> ScaleHeader:
    return {"o": _SCALE, "servers": servers}


def read_scale(header: Header) -> ScaleHeader:
    field(header, "servers", int)
    return cast(ScaleHeader, header)


class ScaleReplyHeader(WireHeader):
    """OK answering SCALE."""

    target: int  # the servers the job now goes to (bounded by 1 and max_servers)


def scale_reply(*, rid: int, target: int) -> ScaleReplyHeader:
    return {"o": _OK, "i": rid, "target": target}


def read_scale_reply(header: Header) -> ScaleReplyHeader:
    field(header, "target", int)
    return cast(ScaleReplyHeader, header)


# -- barriers and broadcast --------------------------------------------------------------


class BarrierHeader(WireHeader):
    """BARRIER, worker -> coordinator; answered OK once every worker arrived."""

    name: str


def barrier(*, name: str) -> BarrierHeader:
    return {"o": _BARRIER, "name": name}


def read_barrier(header: Header) -> BarrierHeader:
    field(header, "name", str)
    return cast(BarrierHeader, header)


class AdoptHeader(WireHeader):
    """ADOPT, worker -> coordinator: this worker adopts worker ``root``'s values (every
    worker asks; a collective, as a barrier); answered :func:`adopt_reply`."""

    root: int


def adopt(*, root: int) -> AdoptHeader:
    return {"o": _ADOPT, "root": root}


def read_adopt(header: Header) -> AdoptHeader:
    field(header, "root", int)
    return cast(AdoptHeader, header)


class AdoptReplyHeader(WireHeader):
    """OK answering ADOPT, once every worker asked: the adoption's number and grant,
    which the root's INITs carry (``ad``, ``g``)."""

    ad: int
    g: bytes


def adopt_reply(*, rid: int, number: int, grant: bytes) -> AdoptReplyHeader:
    return {"o": _OK, "i": rid, "ad": number, "g": grant}


def read_adopt_reply(header: Header) -> AdoptReplyHeader:
    fields(header, (("ad", int), ("g", bytes)))
    return cast(AdoptReplyHeader, header)


class BcastPutHeader(WireHeader):
    """BCAST_PUT, root worker -> coordinator, + the tensors' frames; answered OK once
    every other worker took the value."""

    key: str  # the broadcast's name, the same on every worker
    meta: dict[str, Any]  # relayed unread: names (the tensors, in order), frames (per tensor)


def bcast_put(*, key: str, meta: dict[str, Any]) -> BcastPutHeader:
    return {"o": _BCAST_PUT, "key": key, "meta": meta}


def read_bcast_put(header: Header) -> BcastPutHeader:
    field(header, "key", str)
    field(header, "meta", dict)
    return cast(BcastPutHeader, header)


class BcastGetHeader(WireHeader):
    """BCAST_GET, worker -> coordinator; answered BCAST_VALUE once the root put it.
    Replayed (``rp``) to a replacement coordinator: taken from the one before, not
    answered."""

    key: str
    rp: NotRequired[bool]  # taken from a coordinator before this one


def bcast_get(*, key: str, replayed: bool = False) -> BcastGetHeader:
    header: BcastGetHeader = {"o": _BCAST_GET, "key": key}
    if replayed:
        header["rp"] = True
    return header


def read_bcast_get(header: Header) -> BcastGetHeader:
    field(header, "key", str)
    optional(header, "rp", bool)
    return cast(BcastGetHeader, header)


class BcastValueHeader(WireHeader):
    """BCAST_VALUE, coordinator -> worker, + the root's frames."""

    meta: dict[str, Any]  # as the root put it


def bcast_value(*, rid: int, meta: dict[str, Any]) -> BcastValueHeader:
    return {"o": _BCAST_VALUE, "i": rid, "meta": meta}


def read_bcast_value(header: Header) -> BcastValueHeader:
    """Checks ``meta`` and its ``names`` and ``frames`` lists."""
    meta = field(header, "meta", dict)
    if not isinstance(meta.get("names"), list) or not isinstance(meta.get("frames"), list):
        raise ProtocolError(
            ErrorCode.MALFORMED.value, "a broadcast's 'meta' needs lists 'names' and 'frames'"
        )
    return cast(BcastValueHeader, header)
