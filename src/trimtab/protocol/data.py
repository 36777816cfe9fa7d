"""Data-plane headers: one typed header, one builder and one reader per message between
workers and servers (and between servers, for a chunk's handover).

PUSH, VALUE and PULL are built once per chunk per step: each builder is one call that
returns a dict literal (the very one the roles built before: the same msgpack bytes),
with at most a test or two for the keys a message may leave out; nothing is checked on
build. The readers of PUSH and VALUE, read once per chunk, test every key inline and
fall back to :func:`~trimtab.protocol.messages.field` only to word the error, so a
well-formed message costs one call. Readers raise
``ProtocolError(ErrorCode.MALFORMED.value, ...)`` for a missing or mistyped key; whether
a dtype, element count or frame fits the chunk is the receiver's to check
(``check_tensor_frames``). None blocks; all are thread-safe.
What each short key means is in :mod:`trimtab.protocol.headers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import (
    NUMBER,
    Data,
    ErrorCode,
    Header,
    InlineHeader,
    KeySpec,
    WireHeader,
    field,
    fields,
    int_list,
)

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

_INIT = int(Data.INIT)
_PUSH = int(Data.PUSH)
_PULL = int(Data.PULL)
_VALUE = int(Data.VALUE)
_MOVED = int(Data.MOVED)
_ACK = int(Data.ACK)
_STATS = int(Data.STATS)
_HANDOVER = int(Data.HANDOVER)

#: ``sm`` of a VALUE: the value is in the push's shared-memory slot.
IN_SLOT = 1


#: The worker whose values seed the servers at declaration (its INITs), and which every
#: worker adopts. A server takes an INIT from it only, once per chunk, before the
#: chunk's first round.
SEED_ROOT = 0


class InitHeader(WireHeader):
    """INIT, root worker -> server, + the chunk's value as a frame: set the value;
    answered ACK. Only at declaration: see :data:`SEED_ROOT`."""

    c: int  # chunk id
    e: int  # the sender's map epoch
    dt: str  # the value's wire dtype
    n: int  # its element count
    ad: NotRequired[int]  # after declaration: the adoption (ADOPT's reply) it is part of
    g: NotRequired[bytes]  # and that adoption's grant


def init(*, chunk: int, epoch: int, dtype: str, numel: int) -> InitHeader:
    return {"o": _INIT, "c": chunk, "e": epoch, "dt": dtype, "n": numel}


_INIT_KEYS: KeySpec = (("c", int), ("e", int), ("dt", str), ("n", int))


def read_init(header: Header) -> InitHeader:
    fields(header, _INIT_KEYS, (("ad", int), ("g", bytes)))
    return cast(InitHeader, header)


class PushHeader(InlineHeader):
    """PUSH, worker -> server: a chunk's gradient of one step; answered VALUE once the
    chunk is updated (or MOVED). The gradient is a frame, ``b`` (at most INLINE_MAX
    bytes), the worker's shared memory (``sm``), or absent (``z``)."""

    c: int  # chunk id
    e: int  # the map epoch by which the worker routed it
    dt: NotRequired[str]  # the gradient's wire dtype (maybe compressed); always built
    n: NotRequired[int]  # its element count; always built (a third party's z push may not)
    r: int  # the worker's rank
    k: int  # the worker's clock: the step this gradient is of
    w: float  # its weight: the worker's batch size
    v: NotRequired[int]  # the chunk version the worker last read (its staleness)
    hp: NotRequired[dict[str, Any] | None]  # the param group's hyperparameters, if changed
    z: NotRequired[bool]  # no gradient (the parameter got none this step)
    g: NotRequired[bool]  # answer the round's mean gradient and apply no update
    sm: NotRequired[list[Any]]  # [arena name, offset, capacity] of a shared-memory slot
    ak: NotRequired[bool]  # acknowledge receipt with CREDIT (the sender's credit, P3)
    vk: NotRequired[int]  # > 0: the sender credits values it reads; hold them to vk bytes
    sr: NotRequired[int]  # a sparse gradient's rows: their count (frames: ids, elements)
    hf: NotRequired[int]  # with sr: the version of the hot set the sender holds
    hs: NotRequired[int]  # with hf: that set's rows in the chunk (a last frame: ids)


def push(
    *,
    chunk: int,
    epoch: int,
    dtype: str,
    numel: int,
    rank: int,
    clock: int,
    weight: float,
    version: int,
    hp: dict[str, Any] | None = None,
    empty: bool = False,
    mean_only: bool = False,
) -> PushHeader:
    """``dtype`` is the gradient's wire dtype (the chunk's own for an ``empty`` push).
    ``mean_only``: the round answers the mean gradient, with no update applied (``g``).
    The sender then adds ``sm`` or ``b`` (:func:`~trimtab.protocol.messages.inline`)."""
    header: PushHeader = {
        "o": _PUSH,
        "c": chunk,
        "e": epoch,
        "dt": dtype,
        "n": numel,
        "r": rank,
        "k": clock,
        "w": weight,
        "v": version,
    }
    if hp is not None:
        header["hp"] = hp
    if empty:
        header["z"] = True
    if mean_only:
        header["g"] = True
    return header


_PUSH_KEYS: KeySpec = (("c", int), ("e", int), ("r", int), ("k", int), ("w", NUMBER))
_PUSH_OPTIONAL: KeySpec = (("v", int), ("z", bool), ("g", bool), ("vk", int))


def read_push(header: Header) -> PushHeader:
    """Checks every key's type; ``dt`` and ``n`` are required unless ``z``, ``sm``
    must be ``[str, int, int]``. Whether the weight is positive, the version possible
    and the tensor fits is the server's to say."""
    get = header.get
    z = get("z", False)
    g = get("g", False)
    sm = get("sm")
    hp = get("hp")
    if (
        type(get("c")) is int
        and type(get("e")) is int
        and type(get("r")) is int
        and type(get("k")) is int
        and type(get("w")) in NUMBER
        and type(get("v", 0)) is int
        and type(get("vk", 0)) is int
        and (z is False or z is True)
        and (g is False or g is True)
        and (hp is None or type(hp) is dict)
        and (z or (type(get("dt")) is str and type(get("n")) is int))
        and (sm is None or _is_slot(sm))
    ):
        return cast(PushHeader, header)
    fields(header, _PUSH_KEYS, _PUSH_OPTIONAL)
    if not z:
        fields(header, (("dt", str), ("n", int)))
    if hp is not None and not isinstance(hp, dict):
        raise ProtocolError(ErrorCode.MALFORMED.value, "'hp' must be a map")
    if "sm" in header and not _is_slot(sm):
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            "'sm' must be [arena, offset, capacity], with no tensor frame",
        )
    return cast(PushHeader, header)  # int subclasses, which field() takes too


def _is_slot(sm: Any) -> bool:
    return (
        isinstance(sm, list)
        and len(sm) == 3
        and isinstance(sm[0], str)
        and all(isinstance(x, int) and not isinstance(x, bool) for x in sm[1:])
    )


class PullHeader(WireHeader):
    """PULL, worker -> server: a chunk's current value now, or with ``gm`` the mean
    gradient its round ``gm`` applied (what a Horovod script reads in ``.grad`` after
    ``step()``); answered VALUE (``z``: no worker had a gradient), MOVED, or ERROR
    (BAD_STATE) where the server no longer holds that round's mean."""

    c: int  # chunk id
    e: int  # the sender's map epoch
    gm: NotRequired[int]  # the round whose mean gradient is asked for
    sr: NotRequired[int]  # rows of a table: their count (a frame: their ids, int64)
    gw: NotRequired[list[Any]]  # with sr: a growing table's ids (any int64): its rules


def pull(*, chunk: int, epoch: int, mean_of: int | None = None) -> PullHeader:
    header: PullHeader = {"o": _PULL, "c": chunk, "e": epoch}
    if mean_of is not None:
        header["gm"] = mean_of
    return header


def read_pull(header: Header) -> PullHeader:
    fields(header, (("c", int), ("e", int)), (("gm", int), ("sr", int), ("gw", list)))
    return cast(PullHeader, header)


class ValueHeader(InlineHeader):
    """VALUE, server -> worker: a chunk's updated value (or, in summation mode, its
    aggregated gradient), answering PUSH or PULL. The value is a frame, ``b``, in the
    push's shared-memory slot (``sm``), or absent (``z``)."""

    c: int  # chunk id
    v: int  # the chunk's version: updates applied
    k: int  # the chunk's round: rounds completed
    n: int  # element count
    z: NotRequired[bool]  # no value: no worker had a gradient (summation mode)
    dt: NotRequired[str]  # the value's wire dtype (absent with z)
    sm: NotRequired[int]  # IN_SLOT: the value is in the push's slot
    ak: NotRequired[bool]  # the server counts it against the push's vk: CREDIT it on receipt
    sr: NotRequired[int]  # a row reply: the changed rows' count (frames: ids, elements)
    hv: NotRequired[int]  # the version of the worker's hot set the rows are filtered by
    gc: NotRequired[list[int]]  # a growing table's chunk: its counters (policies/growth.py)


def value(
    *, rid: int, chunk: int, version: int, round: int, numel: int, dtype: str | None
) -> ValueHeader:
    """``dtype`` None: no value (``z``). The sender then adds ``sm`` (IN_SLOT) or ``b``
    (:func:`~trimtab.protocol.messages.inline`)."""
    header: ValueHeader = {
        "o": _VALUE,
        "i": rid,
        "c": chunk,
        "v": version,
        "k": round,
        "n": numel,
    }
    if dtype is None:
        header["z"] = True
    else:
        header["dt"] = dtype
    return header


_VALUE_KEYS: KeySpec = (("c", int), ("v", int), ("k", int), ("n", int))


def read_value(header: Header) -> ValueHeader:
    """Checks every key's type; ``dt`` is required unless ``z``."""
    get = header.get
    z = get("z", False)
    if (
        type(get("c")) is int
        and type(get("v")) is int
        and type(get("k")) is int
        and type(get("n")) is int
        and (z is False or z is True)
        and (z or type(get("dt")) is str)
        and type(get("sm", 0)) is int
    ):
        return cast(ValueHeader, header)
    fields(header, _VALUE_KEYS, (("z", bool), ("sm", int)))
    if not z:
        field(header, "dt", str)
    return cast(ValueHeader, header)


class MovedHeader(WireHeader):
    """MOVED, server -> worker: not the chunk's owner (any more, or not yet for the
    sender's map): refresh the map to ``e`` and resend."""

    c: int  # chunk id
    s: int  # its owner as this server knows it (a server rank)
    e: int  # this server's map epoch


def moved(*, rid: int, chunk: int, owner: int, epoch: int) -> MovedHeader:
    return {"o": _MOVED, "i": rid, "c": chunk, "s": owner, "e": epoch}


def read_moved(header: Header) -> MovedHeader:
    fields(header, (("c", int), ("s", int), ("e", int)))
    return cast(MovedHeader, header)


class AckHeader(WireHeader):
    """ACK, server -> worker or server: INIT or HANDOVER done."""


def ack(*, rid: int) -> AckHeader:
    return {"o": _ACK, "i": rid}


class StatsHeader(WireHeader):
    """STATS, anyone -> server; answered :func:`stats_reply`."""


def stats_request() -> StatsHeader:
    return {"o": _STATS}


class StatsReplyHeader(WireHeader):
    """ACK answering STATS: ``Server.stats()``, spread into the header."""

    index: int  # the server's rank
    epoch: int  # its map epoch
    versions: dict[str, int]  # chunk id (str) -> version, of the chunks it owns
    pushes: int
    shared: int  # pushes whose gradient came through shared memory
    lane: int  # pushes that came over the local lane
    dropped: int
    discounted: int
    held: int  # replies held back by the consistency policy
    errors: int  # requests refused
    moved_in: int
    moved_out: int
    busy_s: float
    bytes: int


def stats_reply(*, rid: int, stats: Mapping[str, Any]) -> StatsReplyHeader:
    """``stats`` is ``Server.stats()``, with the keys of :class:`StatsReplyHeader`."""
    return cast(StatsReplyHeader, {"o": _ACK, "i": rid, **stats})


_STATS_KEYS: KeySpec = (
    ("index", int),
    ("epoch", int),
    ("versions", dict),
    ("pushes", int),
    ("shared", int),
    ("lane", int),
    ("dropped", int),
    ("discounted", int),
    ("held", int),
    ("errors", int),
    ("moved_in", int),
    ("moved_out", int),
    ("busy_s", NUMBER),
    ("bytes", int),
)


def read_stats_reply(header: Header) -> StatsReplyHeader:
    fields(header, _STATS_KEYS)
    return cast(StatsReplyHeader, header)


class HandoverHeader(WireHeader):
    """HANDOVER, old owner -> new owner, + the value and each state tensor as frames:
    a chunk whose rounds before its cut are all applied and answered; answered ACK."""

    c: int  # chunk id
    v: int  # its version
    k: int  # its round
    e: int  # the old owner's map epoch (the new owner waits until it has that map)
    dt: str  # the value's wire dtype
    n: int  # its element count
    p: list[int]  # the chunk's counters: [pushes, dropped, discounted]
    s: NotRequired[int]  # the sender's server index (its credential ``t`` is for it)
    t: NotRequired[bytes]  # the sender's credential as a server
    hp: NotRequired[dict[str, Any]]  # server mode: the optimizer's hyperparameters
    st: NotRequired[dict[str, list[Any]]]  # server mode: state key -> ["t", dtype, shape]
    # (a tensor: the next frame) or ["v", value]
    sm: NotRequired[list[Any]]  # [arena, offset, bytes]: the frames' bytes in the sender's
    # shared memory, one after the other (one machine; no frame follows the header)
    ad: NotRequired[int]  # the last adoption whose INIT set the chunk's value (absent: 0)


def handover(
    *,
    rid: int,
    chunk: int,
    version: int,
    round: int,
    epoch: int,
    dtype: str,
    numel: int,
    counts: list[int],
    sender: int = -1,
    token: bytes | None = None,
    hp: dict[str, Any] | None = None,
    state: dict[str, list[Any]] | None = None,
    adopted: int = 0,
) -> HandoverHeader:
    """``hp`` and ``state`` (server mode) are given together or not at all; ``sender``
    and ``token`` are the sending server's index and credential; ``adopted`` the
    chunk's last adoption (0: none, left out)."""
    header: HandoverHeader = {
        "o": _HANDOVER,
        "c": chunk,
        "v": version,
        "k": round,
        "e": epoch,
        "dt": dtype,
        "n": numel,
        "p": counts,
    }
    if token is not None:
        header["s"] = sender
        header["t"] = token
    if hp is not None:
        header["hp"] = hp
    if state is not None:
        header["st"] = state
    if adopted:
        header["ad"] = adopted
    header["i"] = rid  # last, as the server set it once the rest was built
    return header


_HANDOVER_KEYS: KeySpec = (
    ("c", int),
    ("v", int),
    ("k", int),
    ("e", int),
    ("dt", str),
    ("n", int),
)


def read_handover(header: Header) -> HandoverHeader:
    """Checks every key's type, and that ``p`` is three ints."""
    fields(
        header,
        _HANDOVER_KEYS,
        (("hp", dict), ("st", dict), ("s", int), ("t", bytes), ("sm", list), ("ad", int)),
    )
    if len(int_list(header, "p")) != 3:
        raise ProtocolError(ErrorCode.MALFORMED.value, "'p' must be [pushes, dropped, discounted]")
    return cast(HandoverHeader, header)
