"""Control headers of elastic workers (a worker lost or joining a running job):
WORKERS and its answer WORKERS_ACK, coordinator <-> server; SCALE_WORKERS, tool ->
coordinator. One typed header, builder and reader each, as :mod:`.state` has them.
"""

from __future__ import annotations

from typing import cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Control, ErrorCode, Header, WireHeader, field, int_list

_WORKERS = int(Control.WORKERS)
_WORKERS_ACK = int(Control.WORKERS_ACK)
_SCALE_WORKERS = int(Control.SCALE_WORKERS)
_OK = int(Control.OK)

#: The most worker ranks a WORKERS may name: checked before a server builds anything
#: from the list.
MAX_WORKERS = 65536


class WorkersHeader(WireHeader):
    """WORKERS, coordinator -> server: the ranks whose pushes each round waits for, from
    now on (generation ``g``, rising with every change)."""

    g: int  # the generation of the worker set
    ws: list[int]  # the ranks taking part, sorted


def workers(*, generation: int, ranks: list[int]) -> WorkersHeader:
    return {"o": _WORKERS, "g": generation, "ws": sorted(ranks)}


def read_workers(header: Header) -> WorkersHeader:
    """Raises a MALFORMED :class:`ProtocolError` unless ``g`` is an int and ``ws`` a
    list of at most :data:`MAX_WORKERS` distinct non-negative ints below it, not empty."""
    field(header, "g", int)
    raw = header.get("ws")
    if isinstance(raw, list) and len(raw) > MAX_WORKERS:
        raise ProtocolError(
            ErrorCode.MALFORMED.value, f"a WORKERS names more than {MAX_WORKERS} ranks"
        )
    ranks = int_list(header, "ws")
    if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0 or max(ranks) >= MAX_WORKERS:
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            f"a WORKERS needs distinct ranks in 0..{MAX_WORKERS - 1}, at least one",
        )
    return cast(WorkersHeader, header)


class WorkersAckHeader(WireHeader):
    """WORKERS_ACK, server -> coordinator: it now waits for generation ``g``'s workers."""

    g: int


def workers_ack(*, generation: int) -> WorkersAckHeader:
    return {"o": _WORKERS_ACK, "g": generation}


def read_workers_ack(header: Header) -> WorkersAckHeader:
    field(header, "g", int)
    return cast(WorkersAckHeader, header)


class ScaleWorkersHeader(WireHeader):
    """SCALE_WORKERS, tool -> coordinator: go to this many workers (the launcher starts
    those lacking); answered OK {target} (:func:`scale_workers_reply`)."""

    workers: int


def scale_workers(*, workers: int) -> ScaleWorkersHeader:
    return {"o": _SCALE_WORKERS, "workers": workers}


def read_scale_workers(header: Header) -> ScaleWorkersHeader:
    field(header, "workers", int)
    return cast(ScaleWorkersHeader, header)


class ScaleWorkersReplyHeader(WireHeader):
    """OK answering SCALE_WORKERS."""

    target: int  # the workers the job now goes to


def scale_workers_reply(*, rid: int, target: int) -> ScaleWorkersReplyHeader:
    return {"o": _OK, "i": rid, "target": target}


def read_scale_workers_reply(header: Header) -> ScaleWorkersReplyHeader:
    field(header, "target", int)
    return cast(ScaleWorkersReplyHeader, header)


def builders() -> list[WireHeader]:
    """One header of each op this module builds (for tests that cover every op)."""
    return [workers(generation=1, ranks=[0]), workers_ack(generation=1), scale_workers(workers=1)]
