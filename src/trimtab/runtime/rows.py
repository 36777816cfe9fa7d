"""Rows of a table inside a chunk: the arithmetic both ends of the row path share.

A table (an embedding's weight, ``[rows, width]``) is cut into chunks like any tensor:
each chunk is a flat slice ``[offset, offset + numel)`` of it, so a row may straddle two
chunks. A row message names whole rows by their ids and carries, in row order, only
those of their elements that lie inside the chunk; both ends derive which elements those
are from the ids alone (:func:`elements`). Pure functions of tensors: nothing blocks,
nothing here is shared.
"""

from __future__ import annotations

import torch


def width_of(shape: tuple[int, ...]) -> int:
    """Elements per row of a table of ``shape`` (its first dimension counts rows); 1 for
    a vector. Pure."""
    width = 1
    for d in shape[1:]:
        width *= d
    return width


def row_span(width: int, offset: int, numel: int) -> tuple[int, int]:
    """The rows ``[first, end)`` that have an element in the chunk ``[offset, offset +
    numel)`` of a table with rows of ``width`` elements. Pure."""
    return offset // width, (offset + numel + width - 1) // width


def whole_rows(width: int, offset: int, numel: int) -> tuple[int, int]:
    """The rows ``[first, end)`` wholly inside the chunk ``[offset, offset + numel)`` of
    a table with rows of ``width`` elements (a growing table's rows to give out). Pure."""
    return (offset + width - 1) // width, (offset + numel) // width


def elements(ids: torch.Tensor, width: int, offset: int, numel: int) -> torch.Tensor:
    """The positions within the chunk (int64, in row order) of every element of the rows
    ``ids`` (int64, each in :func:`row_span`) that lies inside the chunk. Pure."""
    if width == 1:
        return ids - offset
    flat = ids.view(-1, 1) * width + torch.arange(width, dtype=torch.int64) - offset
    if offset % width == 0 and (offset + numel) % width == 0:
        return flat.view(-1)  # a chunk of whole rows: every element is inside
    return flat[(flat >= 0) & (flat < numel)]


def split(
    grad: torch.Tensor, spans: list[tuple[int, int, int]]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A sparse gradient of a table, coalesced (unique, sorted row ids: the worker's
    rows deduplicated), as ``(ids, values)`` per chunk: for each ``(width, offset,
    numel)`` of ``spans``, the ids of the rows with an element in it and those elements'
    gradients (contiguous, row order). Pure."""
    g = grad.coalesce()
    if g.sparse_dim() != 1:  # element-wise coordinates: make them rows
        g = g.to_dense().to_sparse(1).coalesce()
    ids = g.indices()[0].contiguous()
    values = g.values()  # (flattened per row; a gradient of no rows has a shape too)
    values = values.unsqueeze(1) if values.dim() == 1 else values.flatten(1)
    out = []
    firsts = [row_span(width, offset, numel) for width, offset, numel in spans]
    bounds = torch.searchsorted(ids, torch.tensor(firsts, dtype=ids.dtype).view(-1)).tolist()
    for i, (width, offset, numel) in enumerate(spans):
        lo, hi = bounds[2 * i], bounds[2 * i + 1]  # (one search for every chunk)
        mine = ids[lo:hi]
        rows = values[lo:hi].reshape(-1)
        if offset % width or (offset + numel) % width:
            flat = mine.view(-1, 1) * width + torch.arange(width) - offset
            rows = rows[((flat >= 0) & (flat < numel)).view(-1)]
        out.append((mine, rows.contiguous()))
    return out


def rows_of(positions: torch.Tensor, width: int, offset: int) -> torch.Tensor:
    """The sorted unique ids of the rows the chunk positions ``positions`` belong to.
    Pure."""
    ids: torch.Tensor = torch.unique((positions + offset) // width)
    return ids


def assemble(
    shape: tuple[int, ...], pieces: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype
) -> torch.Tensor:
    """A sparse tensor of ``shape`` (rows sparse, each row dense) from pieces ``(flat
    positions in the whole table, values)``, as torch's embedding gradients are laid out
    (and so as its optimizers read them). Pure."""
    width = width_of(shape)
    if pieces:
        positions = torch.cat([p for p, _ in pieces])
        values = torch.cat([v for _, v in pieces])
    else:
        positions = torch.zeros(0, dtype=torch.int64)
        values = torch.zeros(0, dtype=dtype)
    ids = torch.unique(positions // width)
    dense = torch.zeros(ids.numel(), width, dtype=dtype)
    at = torch.searchsorted(ids, positions // width)
    dense[at, positions % width] = values.to(dtype)
    return torch.sparse_coo_tensor(
        ids.view(1, -1), dense.view(ids.numel(), *shape[1:]), shape, check_invariants=False
    ).coalesce()
