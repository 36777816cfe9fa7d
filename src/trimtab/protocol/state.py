"""Data-plane headers of a chunk's optimizer state, worker <-> server: STATE_GET and its
answer STATE (a checkpoint's save), STATE_SET (a checkpoint's load, or the first
step's update handed to the servers). One typed header, builder and reader each, as
:mod:`.data` has them; the state itself travels as HANDOVER carries it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Data, ErrorCode, Header, WireHeader, field, fields

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

_STATE_GET = int(Data.STATE_GET)
_STATE = int(Data.STATE)
_STATE_SET = int(Data.STATE_SET)

#: ``st`` of STATE and STATE_SET, as of HANDOVER: state key -> ``["t", dtype, shape]``
#: (a tensor: the next frame, in the keys' order) or ``["v", value]``.
StateMeta = dict[str, list[Any]]


class StateGetHeader(WireHeader):
    """STATE_GET, worker -> server: a chunk's optimizer state (server mode); answered
    STATE (or MOVED)."""

    c: int  # chunk id
    e: int  # the sender's map epoch


def state_get(*, chunk: int, epoch: int) -> StateGetHeader:
    return {"o": _STATE_GET, "c": chunk, "e": epoch}


def read_state_get(header: Header) -> StateGetHeader:
    fields(header, (("c", int), ("e", int)))
    return cast(StateGetHeader, header)


class StateHeader(WireHeader):
    """STATE, server -> worker, + each state tensor as a frame: a chunk's optimizer
    state, answering STATE_GET."""

    c: int  # chunk id
    v: int  # its version
    k: int  # its round
    hp: dict[str, Any]  # the chunk optimizer's hyperparameters
    st: StateMeta  # its state (empty: none yet)


def state(
    *, rid: int, chunk: int, version: int, round: int, hp: dict[str, Any], state: StateMeta
) -> StateHeader:
    return {"o": _STATE, "i": rid, "c": chunk, "v": version, "k": round, "hp": hp, "st": state}


def read_state(header: Header) -> StateHeader:
    """Checks every key's type; that the tensor frames fit ``st`` is the receiver's."""
    fields(header, (("c", int), ("v", int), ("k", int), ("hp", dict), ("st", dict)))
    _check_meta(header)
    return cast(StateHeader, header)


class StateSetHeader(WireHeader):
    """STATE_SET, worker -> server, + the value (with ``dt``) and each state tensor as
    frames: replace a chunk's optimizer state (an empty ``st`` clears it) and, with
    ``dt``, its value; answered ACK (or MOVED)."""

    c: int  # chunk id
    e: int  # the sender's map epoch
    st: StateMeta  # the new state
    hp: NotRequired[dict[str, Any]]  # the hyperparameters, if to be set too
    dt: NotRequired[str]  # the value's wire dtype: a value frame comes first
    n: NotRequired[int]  # its element count (with dt)


def state_set(
    *,
    chunk: int,
    epoch: int,
    state: StateMeta,
    hp: dict[str, Any] | None = None,
    dtype: str | None = None,
    numel: int = 0,
) -> StateSetHeader:
    """``dtype`` (and ``numel``): the message carries the chunk's value first."""
    header: StateSetHeader = {"o": _STATE_SET, "c": chunk, "e": epoch, "st": state}
    if hp is not None:
        header["hp"] = hp
    if dtype is not None:
        header["dt"] = dtype
        header["n"] = numel
    return header


def read_state_set(header: Header) -> StateSetHeader:
    """Checks every key's type (``n`` required with ``dt``); whether the frames fit the
    chunk and ``st`` is the server's to say."""
    fields(header, (("c", int), ("e", int), ("st", dict)), (("hp", dict), ("dt", str)))
    if "dt" in header:
        field(header, "n", int)
    _check_meta(header)
    return cast(StateSetHeader, header)


def _check_meta(header: Header) -> None:
    for key, entry in header["st"].items():
        ok = isinstance(key, str) and isinstance(entry, list) and len(entry) >= 2
        if ok and entry[0] == "t":
            ok = (
                len(entry) == 3
                and isinstance(entry[1], str)
                and isinstance(entry[2], list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry[2])
            )
        elif ok:
            ok = entry[0] == "v" and len(entry) == 2
        if not ok:
            raise ProtocolError(
                ErrorCode.MALFORMED.value,
                f"op {header.get('o')}: 'st' entry {key!r} is not ['t', dtype, shape] "
                "or ['v', value]",
            )
