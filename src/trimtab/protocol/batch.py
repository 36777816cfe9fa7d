"""Batches: several row requests to one server in one message, and their replies in one.

A worker's step reads and pushes the rows of many chunks, most of them on the same few
servers; each request is a message whose cost (building, sending, receiving, waking) is
the same whatever it carries (~130 us of CPU a message here against a few us a row). A
BATCH carries whole requests for one server, each part as it would travel alone (its
header frame, then its payload frames); ``n`` lists each part's frame count. The server
serves each part as the request it is and answers the BATCH once every part is answered,
with one message of the parts' replies laid out the same way (a part's reply may be an
ERROR or a MOVED of its own: the worker resends that part alone, as today). Only row
PULLs and row PUSHes (``sr``) travel in a batch. Pure; nothing here blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Data, ErrorCode, encode

#: The most parts one batch may carry (a step's chunks of one server are far fewer).
MAX_PARTS = 1024
#: The most frames one part may carry (a row push: ids, rows, its hot set's ids).
MAX_PART_FRAMES = 4


def pack(
    rid: int, job: str, parts: Sequence[Sequence[Any]], extra: dict[str, Any] | None = None
) -> list[Any]:
    """The frames of a BATCH ``rid`` of job ``job`` carrying ``parts`` (each a request's
    or reply's frames, its encoded header first), with ``extra`` keys in its header
    (a worker's ``r`` and ``t``). Pure."""
    header: dict[str, Any] = {
        "o": int(Data.BATCH),
        "i": rid,
        "j": job,
        "n": [len(p) for p in parts],
    }
    if extra:
        header.update(extra)
    out: list[Any] = [encode(header)]
    for part in parts:
        out.extend(part)
    return out


def unpack(header: dict[str, Any], frames: Sequence[memoryview]) -> list[list[memoryview]]:
    """The parts of a BATCH (``header`` decoded; ``frames``: those after it), each a
    list of frames whose first is a header frame. Raises a MALFORMED
    :class:`ProtocolError` unless ``n`` is a list of 1 to :data:`MAX_PARTS` counts, each
    1 to :data:`MAX_PART_FRAMES`, adding up to the frames carried. Pure."""
    counts = header.get("n")
    if (
        not isinstance(counts, list)
        or not 0 < len(counts) <= MAX_PARTS
        or not all(type(k) is int and 0 < k <= MAX_PART_FRAMES for k in counts)
    ):
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            f"a batch's 'n' must list 1 to {MAX_PARTS} frame counts of 1 to {MAX_PART_FRAMES}",
        )
    if sum(counts) != len(frames):
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            f"a batch of {sum(counts)} frames by its 'n' carries {len(frames)}",
        )
    out, at = [], 0
    for k in counts:
        out.append(list(frames[at : at + k]))
        at += k
    return out
