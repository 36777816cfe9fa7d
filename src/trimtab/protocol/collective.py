"""Collective headers (Horovod's ``allreduce``, ``allgather``, ``broadcast``, objects,
``join``): GATHER, a worker's part, and GATHERED, every worker's parts.

A collective is one gather through the coordinator: each worker sends its part (a
GATHER with the collective's ``key``, a ``sig`` that must be the same on every worker,
its own ``meta`` and its buffers); once every worker sent the key, each is answered with
every part in rank order (GATHERED), and reduces, concatenates or picks what it needs
itself. The coordinator reads no tensor: it compares signatures and relays bytes.

Builders check nothing; readers check types and raise
``ProtocolError(ErrorCode.MALFORMED.value, ...)``. None blocks; all are thread-safe.
"""

from __future__ import annotations

from typing import Any, cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Control, ErrorCode, Header, WireHeader, field, int_list

_GATHER = int(Control.GATHER)
_GATHERED = int(Control.GATHERED)


class GatherHeader(WireHeader):
    """GATHER, worker -> coordinator, + the worker's buffers; answered GATHERED once
    every worker sent ``key``, or ERROR (``mismatch``) if their ``sig`` differ."""

    key: str  # the collective's name: "@" + the user's, or "#" + a per-process count
    sig: str  # what must agree on every worker (kind, dtype, shape, op, root), readable:
    #           it is quoted, per rank, in the mismatch error
    meta: dict[str, Any]  # this worker's own (e.g. its first dimension), relayed unread


def gather(*, key: str, sig: str, meta: dict[str, Any]) -> GatherHeader:
    return {"o": _GATHER, "key": key, "sig": sig, "meta": meta}


def read_gather(header: Header) -> GatherHeader:
    field(header, "key", str)
    field(header, "sig", str)
    field(header, "meta", dict)
    return cast(GatherHeader, header)


class GatheredHeader(WireHeader):
    """GATHERED, coordinator -> worker, + every worker's buffers in rank order."""

    metas: list[dict[str, Any]]  # each worker's ``meta``, by rank
    n: list[int]  # how many of the buffers are each worker's, by rank
    last: int  # the rank whose part arrived last (Horovod's ``join()`` returns it)


def gathered(*, rid: int, metas: list[dict[str, Any]], n: list[int], last: int) -> GatheredHeader:
    return {"o": _GATHERED, "i": rid, "metas": metas, "n": n, "last": last}


def read_gathered(header: Header) -> GatheredHeader:
    """Checks ``metas`` (a map per rank), ``n`` (as many counts) and ``last``."""
    metas = field(header, "metas", list)
    counts = int_list(header, "n")
    field(header, "last", int)
    if len(counts) != len(metas) or not all(isinstance(m, dict) for m in metas):
        raise ProtocolError(
            ErrorCode.MALFORMED.value, "GATHERED needs one meta map and one count per worker"
        )
    return cast(GatheredHeader, header)
