"""Headers of server replicas and failover (``--replicas 1``): REPLICATE, a chunk's
primary sending its backup the chunk as of a round (server <-> server, answered ACK),
and FAILOVER / FAILOVER_ACK, the coordinator promoting the backups of a dead server's
chunks under a new map epoch. One typed header, builder and reader each, as
:mod:`.data` has them.

The backup table travels in the job map too (MAP and EXTEND), as ``bk``: each chunk's
backup server index, -1 for none (:func:`read_backups`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import (
    NUMBER,
    Control,
    Data,
    ErrorCode,
    Header,
    KeySpec,
    WireHeader,
    fields,
    int_list,
)

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

#: REPLICATE request ids start here, apart from a HANDOVER's (both are answered by an
#: ACK, matched by request id and peer); a server handles these ACKs first.
FIRST_RID = 1 << 40

_REPLICATE = int(Data.REPLICATE)
_FAILOVER = int(Control.FAILOVER)
_FAILOVER_ACK = int(Control.FAILOVER_ACK)
_HOLDINGS = int(Control.HOLDINGS)
_HELD = int(Control.HELD)


class ReplicateHeader(WireHeader):
    """REPLICATE, a chunk's primary -> its backup, + the value and each state tensor as
    frames (as HANDOVER carries them): the chunk as of round ``k``, all of whose
    rounds before are applied. Answered ACK; the primary releases round ``k - 1``'s
    values to the workers only then."""

    c: int  # chunk id
    v: int  # its version
    k: int  # its round (rounds completed)
    e: int  # the sender's map epoch (a fencing token: see ErrorCode.STALE_EPOCH)
    s: int  # the sender's server index
    t: bytes  # the sender's credential as a server
    dt: str  # the value's wire dtype
    n: int  # its element count
    p: list[int]  # the chunk's counters: [pushes, dropped, discounted]
    ls: float  # the last round's sum of weights (the next round's predicted divisor)
    lc: list[list[int]]  # [[worker rank, the last clock it pushed], ...]
    hp: NotRequired[dict[str, Any]]  # server mode: the optimizer's hyperparameters
    st: NotRequired[dict[str, list[Any]]]  # server mode: its state (as HANDOVER's)
    sm: NotRequired[list[Any]]  # [arena, offset, bytes]: the frames' bytes, one after
    # the other, in the sender's shared memory (no frame follows the header)
    ad: NotRequired[int]  # the last adoption whose INIT set the chunk's value (absent: 0)


def replicate(
    *,
    rid: int,
    chunk: int,
    version: int,
    round: int,
    epoch: int,
    sender: int,
    token: bytes,
    dtype: str,
    numel: int,
    counts: list[int],
    last_sum: float,
    last_clock: dict[int, int],
    hp: dict[str, Any] | None = None,
    state: dict[str, list[Any]] | None = None,
    adopted: int = 0,
) -> ReplicateHeader:
    header: ReplicateHeader = {
        "o": _REPLICATE,
        "i": rid,
        "c": chunk,
        "v": version,
        "k": round,
        "e": epoch,
        "s": sender,
        "t": token,
        "dt": dtype,
        "n": numel,
        "p": counts,
        "ls": last_sum,
        "lc": [[r, k] for r, k in sorted(last_clock.items())],
    }
    if hp is not None:
        header["hp"] = hp
    if state is not None:
        header["st"] = state
    if adopted:
        header["ad"] = adopted
    return header


_REPLICATE_KEYS: KeySpec = (
    ("c", int),
    ("v", int),
    ("k", int),
    ("e", int),
    ("s", int),
    ("t", bytes),
    ("dt", str),
    ("n", int),
    ("p", list),
    ("ls", NUMBER),
    ("lc", list),
)


def read_replicate(header: Header) -> ReplicateHeader:
    """A REPLICATE, checked. Raises a MALFORMED :class:`ProtocolError` for a missing or
    mistyped key, counters that are not three ints, clocks not ``[rank, clock]`` pairs
    of ints, or a state entry that is not ``["t", ...]`` or ``["v", ...]``."""
    fields(header, _REPLICATE_KEYS, (("hp", dict), ("st", dict), ("sm", list), ("ad", int)))
    counts = int_list(header, "p")
    if len(counts) != 3:
        raise ProtocolError(ErrorCode.MALFORMED.value, "REPLICATE: 'p' must be 3 counters")
    for pair in header["lc"]:
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and all(type(x) is int for x in pair)  # (no bool)
        ):
            raise ProtocolError(
                ErrorCode.MALFORMED.value, "REPLICATE: 'lc' must be [rank, clock] pairs"
            )
    for entry in header.get("st", {}).values():
        if not (isinstance(entry, list) and entry and entry[0] in ("t", "v")):
            raise ProtocolError(
                ErrorCode.MALFORMED.value, "REPLICATE: each 'st' entry is ['t' | 'v', ...]"
            )
    return cast(ReplicateHeader, header)


class FailoverHeader(WireHeader):
    """FAILOVER, coordinator -> every live server: server ``dead`` is gone; from map
    ``e`` each chunk is ``owners``' (a dead server's chunks: their backups') with the
    backups ``bk`` (-1: none). Answered FAILOVER_ACK. Coordinator -> every worker, with
    only ``e`` and ``dead`` (the server's address): the requests it left unanswered go
    to the new owners."""

    e: int  # the failover map's epoch
    dead: int | str  # the dead server's index (to servers), its address (to workers)
    owners: NotRequired[list[int]]
    bk: NotRequired[list[int]]
    servers: NotRequired[list[str]]


def failover(
    *, epoch: int, dead: int, owners: list[int], backups: list[int], servers: list[str]
) -> FailoverHeader:
    """The servers' FAILOVER."""
    return {
        "o": _FAILOVER,
        "e": epoch,
        "dead": dead,
        "owners": owners,
        "bk": backups,
        "servers": servers,
    }


def failover_notice(*, epoch: int, dead: str) -> FailoverHeader:
    """The workers' FAILOVER: ``dead`` is the lost server's address."""
    return {"o": _FAILOVER, "e": epoch, "dead": dead}


def read_failover(header: Header) -> FailoverHeader:
    """A server's FAILOVER, checked (MALFORMED :class:`ProtocolError` otherwise)."""
    fields(header, (("e", int), ("dead", int), ("servers", list)))
    owners = int_list(header, "owners")
    if len(int_list(header, "bk")) != len(owners):
        raise ProtocolError(ErrorCode.MALFORMED.value, "FAILOVER: 'bk' and 'owners' differ")
    return cast(FailoverHeader, header)


def read_failover_notice(header: Header) -> FailoverHeader:
    """A worker's FAILOVER, checked (MALFORMED :class:`ProtocolError` otherwise)."""
    fields(header, (("e", int), ("dead", str)))
    return cast(FailoverHeader, header)


class FailoverAckHeader(WireHeader):
    """FAILOVER_ACK, server -> coordinator: it took failover map ``e``."""

    e: int


def failover_ack(*, epoch: int) -> FailoverAckHeader:
    return {"o": _FAILOVER_ACK, "e": epoch}


def read_failover_ack(header: Header) -> FailoverAckHeader:
    fields(header, (("e", int),))
    return cast(FailoverAckHeader, header)


class HoldingsHeader(WireHeader):
    """HOLDINGS, coordinator -> server: a server died while chunks moved to map ``e``;
    which chunks do you hold? Answered :func:`held`."""

    e: int


def holdings(*, epoch: int) -> HoldingsHeader:
    return {"o": _HOLDINGS, "e": epoch}


def read_holdings(header: Header) -> HoldingsHeader:
    fields(header, (("e", int),))
    return cast(HoldingsHeader, header)


class HeldHeader(WireHeader):
    """HELD, server -> coordinator, answering HOLDINGS ``e``: ``h``, each chunk it holds
    (owned, a backup's copy, or a copy a new map took from it) and the rounds applied
    to the newest of them."""

    e: int
    h: list[list[int]]  # [[chunk id, rounds applied], ...]


def held(*, epoch: int, rounds: dict[int, int]) -> HeldHeader:
    return {"o": _HELD, "e": epoch, "h": [[c, k] for c, k in sorted(rounds.items())]}


def read_held(header: Header, chunks: int) -> tuple[int, dict[int, int]]:
    """A HELD's epoch and rounds by chunk. Raises a MALFORMED :class:`ProtocolError`
    for pairs that are not ``[chunk id < chunks, round >= 0]``."""
    fields(header, (("e", int), ("h", list)))
    rounds: dict[int, int] = {}
    for pair in header["h"]:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(type(x) is int for x in pair)
            or not 0 <= pair[0] < chunks
            or pair[1] < 0
        ):
            raise ProtocolError(ErrorCode.MALFORMED.value, f"HELD: a bad pair {pair!r}")
        rounds[pair[0]] = pair[1]
    return header["e"], rounds


def read_backups(header: Header | Any, chunks: int) -> list[int]:
    """A job map's backup table ``bk`` (every chunk's backup server, -1: none), or all
    -1 where the map has none. Raises a MALFORMED :class:`ProtocolError` for a table
    that is not ``chunks`` ints."""
    if "bk" not in header:
        return [-1] * chunks
    backups = int_list(cast(Header, header), "bk")
    if len(backups) != chunks:
        raise ProtocolError(
            ErrorCode.MALFORMED.value, f"backup table of {len(backups)} for {chunks} chunks"
        )
    return backups
