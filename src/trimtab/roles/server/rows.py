"""A server's row path: pushes of a sparse gradient (an embedding's touched rows) into a
chunk of a table, and the round that applies them with torch's sparse semantics.

A row push (PUSH with ``sr``: the row count) carries two frames: the ids of the rows it
touches (int64, strictly increasing: the worker deduplicated them) and, in row order,
those rows' elements inside the chunk (:func:`trimtab.runtime.rows.elements`). The
round merges every worker's rows, each scaled by its weight, into one coalesced sparse
gradient over the chunk's elements and steps the chunk's own torch optimizer with it:
SGD, Adagrad and SparseAdam then update (and keep state for) the touched rows only,
exactly as they do on the whole table in one process. The reply names the rows that
changed and carries their new elements (or, in summation mode, their mean gradient).
Nothing here sends or blocks; the store calls it from the server's loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ProtocolError
from trimtab.protocol.headers import PushHeader
from trimtab.protocol.messages import ErrorCode
from trimtab.roles.server.chunk import Chunk
from trimtab.runtime.rows import elements, row_span, rows_of
from trimtab.runtime.tensors import TORCH_DTYPES, tensor_from

#: A row push read: the chunk positions of its elements, their gradients, and the hot
#: set the worker holds (``(version, ids)``) if the push says it.
Rows = tuple[torch.Tensor, torch.Tensor, tuple[int, torch.Tensor] | None]


def _bad(code: ErrorCode, why: str) -> ProtocolError:
    return ProtocolError(code.value, why)


def read_rows(chunk: Chunk, width: int, msg: PushHeader, frames: Sequence[memoryview]) -> Rows:
    """Validate a row push to ``chunk`` (of a table with rows of ``width`` elements):
    ``msg`` read, ``frames`` its tensor frames. Returns the positions and gradients it
    carries (copies). Raises :class:`ProtocolError`: MALFORMED for a bad row count, frame
    count or size, an id out of the chunk's rows or not strictly increasing, or shared
    memory; BAD_DTYPE for a dtype other than the chunk's; BAD_STATE where this round
    merged a dense gradient already. Nothing changed then."""
    count = msg.get("sr")
    spec = chunk.spec
    if type(count) is not int or count < 0 or "sm" in msg or msg.get("z"):
        raise _bad(ErrorCode.MALFORMED, "'sr' must be a row count, without 'sm' or 'z'")
    if chunk.any_grad:
        raise _bad(
            ErrorCode.BAD_STATE,
            f"chunk {spec.id}: rows pushed to a round that merged a dense gradient",
        )
    if msg.get("dt") != spec.dtype:
        raise _bad(ErrorCode.BAD_DTYPE, f"rows of chunk {spec.id} travel as {spec.dtype}")
    frames = list(frames)
    hot = _read_hot(chunk, width, msg, frames)
    if count == 0:
        if frames:
            raise _bad(ErrorCode.MALFORMED, "a push of no rows carries no frames")
        empty = torch.zeros(0, dtype=TORCH_DTYPES[spec.dtype])
        return torch.zeros(0, dtype=torch.int64), empty, hot
    if len(frames) != 2:
        raise _bad(ErrorCode.MALFORMED, f"{count} rows need 2 frames (ids, elements)")
    _, positions = read_ids(chunk, width, count, frames[0])
    n = positions.numel()
    if msg.get("n") != n or frames[1].nbytes != n * DTYPE_SIZES[spec.dtype]:
        raise _bad(ErrorCode.MALFORMED, f"{count} rows of chunk {spec.id} hold {n} elements")
    return positions, tensor_from(frames[1], spec.dtype, n).clone(), hot


def _read_hot(
    chunk: Chunk, width: int, msg: PushHeader, frames: list[memoryview]
) -> tuple[int, torch.Tensor] | None:
    """The hot set a row push tells (``hf``: its version; ``hs``: its rows in the chunk,
    their ids the last frame, which is taken off ``frames``), or None. Raises MALFORMED
    as :func:`read_ids`."""
    version, count = msg.get("hf"), msg.get("hs")
    if count is None:
        return None
    if type(version) is not int or type(count) is not int or count < 0:
        raise _bad(ErrorCode.MALFORMED, "'hs' (a row count) needs 'hf' (a version)")
    if count == 0:
        return version, torch.zeros(0, dtype=torch.int64)
    if not frames:
        raise _bad(ErrorCode.MALFORMED, "'hs' rows need a frame of their ids")
    ids, _ = read_ids(chunk, width, count, frames.pop())
    return version, ids


def answer_for(
    chunk: Chunk, width: int, rank: int, ids: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """What worker ``rank`` gets of a round that changed rows ``ids`` (``values``: their
    new elements, in row order): all of it, or, where it holds hot rows, those of them
    (their new elements)."""
    held = chunk.hot.get(rank)
    if held is None:
        return ids, values
    keep = torch.isin(ids, held[1])
    spec = chunk.spec
    if spec.offset % width == 0 and spec.numel % width == 0:  # whole rows: pick them
        return ids[keep], values.view(-1, width)[keep].view(-1)
    mine = ids[keep]
    return mine, chunk.value[elements(mine, width, spec.offset, spec.numel)]


def follow_hot(chunk: Chunk, ids: torch.Tensor) -> None:
    """Asynchronous modes: a round changed rows ``ids`` (sorted): add those of each
    worker's hot set to the rows its next answer carries. So a worker's replicas follow
    every worker's updates, each answer bringing them as of its round, as its dense
    values are: within SSP's bound with no read of their own. Never blocks."""
    for rank, (_, held) in chunk.hot.items():
        mine = ids[torch.isin(ids, held)]
        if not mine.numel():
            continue
        before = chunk.hot_changed.get(rank)
        if before is not None:
            mine = torch.unique(torch.cat([before, mine]))
        chunk.hot_changed[rank] = mine


def hot_answer(chunk: Chunk, width: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asynchronous modes: what worker ``rank``'s answer carries (and no later one
    again): the rows of its hot set changed since its last answer (:func:`follow_hot`;
    a set it just told: all of them) and their current elements, copied. Never blocks."""
    ids = chunk.hot_changed.pop(rank, None)
    if ids is None:
        ids = torch.zeros(0, dtype=torch.int64)
    spec = chunk.spec
    if spec.offset % width == 0 and spec.numel % width == 0:  # whole rows: gather them
        local = ids - spec.offset // width
        return ids, chunk.value.view(-1, width)[local].reshape(-1)
    return ids, chunk.value[elements(ids, width, spec.offset, spec.numel)]


def read_ids(
    chunk: Chunk, width: int, count: int, frame: memoryview
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` row ids ``frame`` holds (int64) and the chunk positions of those
    rows' elements. Raises a MALFORMED :class:`ProtocolError` for a frame of another
    size, or ids out of the chunk's rows or not strictly increasing."""
    spec = chunk.spec
    if count < 1 or frame.nbytes != 8 * count:
        raise _bad(ErrorCode.MALFORMED, f"{count} row ids need {8 * count} bytes")
    ids = torch.frombuffer(bytearray(frame), dtype=torch.int64)
    first, end = row_span(width, spec.offset, spec.numel)
    if int(ids[0]) < first or int(ids[-1]) >= end or bool((ids[1:] <= ids[:-1]).any()):
        raise _bad(
            ErrorCode.MALFORMED,
            f"chunk {spec.id} holds rows {first} to {end - 1}: row ids must lie there, "
            "strictly increasing",
        )
    return ids, elements(ids, width, spec.offset, spec.numel)


def merge_rows(chunk: Chunk, rows: Rows, alpha: float) -> None:
    """Add a read row push, its gradients scaled by ``alpha``, to the chunk's round."""
    positions, values, _ = rows
    if chunk.rows is None:
        chunk.rows = []
    chunk.rows.append((positions, values.to(chunk.merge.dtype).mul_(alpha)))


def is_rows(chunk: Chunk) -> bool:
    """Whether the chunk's round merged rows (and no dense gradient)."""
    return chunk.rows is not None


def apply_rows(
    chunk: Chunk, width: int, factor: float, applies: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Complete a round of rows: their merged gradient (times ``factor``) as one sparse
    gradient of the chunk, stepped by its optimizer if ``applies``. Returns the ids of
    the rows that changed and, in order, their new elements inside the chunk (with
    ``applies``) or their mean gradient. Leaves the chunk with no rows."""
    parts = chunk.rows or []
    chunk.rows = None
    spec = chunk.spec
    if parts:
        positions = torch.cat([p for p, _ in parts])
        values = torch.cat([v for _, v in parts])
    else:
        positions = torch.zeros(0, dtype=torch.int64)
        values = torch.zeros(0, dtype=chunk.merge.dtype)
    if factor != 1.0:
        values.mul_(factor)
    if spec.offset % width == 0 and spec.numel % width == 0 and width > 1:
        return _apply_whole_rows(chunk, width, positions, values, applies)
    grad = torch.sparse_coo_tensor(
        positions.view(1, -1), values, (spec.numel,), check_invariants=False
    ).coalesce()
    positions = grad.indices()[0]
    ids = rows_of(positions, width, spec.offset)
    if not applies:
        return ids, grad.values()
    assert chunk.optimizer is not None
    chunk.optimizer.step(grad.to(chunk.value.dtype))
    return ids, chunk.value[positions]


def _apply_whole_rows(
    chunk: Chunk, width: int, positions: torch.Tensor, values: torch.Tensor, applies: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rows` for a chunk of whole rows: the pushes' elements are whole rows
    in row order (:func:`read_rows`), so the gradient is one of rows (``[rows, width]``),
    which the optimizer steps on a row view of the chunk (:meth:`ChunkOptimizer.step_rows`:
    the same arithmetic, a quarter of the time)."""
    spec = chunk.spec
    local = positions.view(-1, width)[:, 0] // width  # (each row's first element)
    grad = torch.sparse_coo_tensor(
        local.view(1, -1),
        values.view(-1, width),
        (spec.numel // width, width),
        check_invariants=False,
    ).coalesce()
    local = grad.indices()[0]
    ids = local + spec.offset // width
    if not applies:
        return ids, grad.values().reshape(-1)
    assert chunk.optimizer is not None
    chunk.optimizer.step_rows(grad.to(chunk.value.dtype))
    return ids, chunk.value.view(-1, width)[local].reshape(-1)
