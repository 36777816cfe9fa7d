"""Tables that live on the servers: the parameter a worker holds for one, how the
servers are seeded with its values, and how a worker reads its rows.

A server table (:class:`trimtab.nn.Embedding`'s weight) is an ``nn.Parameter`` of the
table's shape that holds one element (every row strides onto it): the optimizer and
``named_parameters`` see it as usual, autograd accumulates its sparse gradient, and
:class:`~trimtab.DistributedOptimizer` declares it as a tensor of the job, cut into row
blocks that are ordinary chunks (placement, migration, replicas and checkpoints apply).
Its values exist only on the servers: seeded chunk by chunk from a seeded generator
(never the whole table at once), read row by row (:func:`pull_rows`), updated there
with the rows each step pushes. Nothing here holds a lock; calls block where they say.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec
from trimtab.errors import UsageError
from trimtab.protocol import headers
from trimtab.roles.worker.replies import Reply
from trimtab.runtime.rows import elements, row_span, width_of
from trimtab.runtime.tensors import TORCH_DTYPES, as_bytes

_ATTR = "_trimtab_table"


#: Starting values are drawn in blocks of this many elements, each from a generator of
#: its own: the same table whatever the chunks, workers and servers.
BLOCK = 1 << 16
_LINK = "_trimtab_pusher"
_HOT = "_trimtab_hot"
_POINTERS: set[int] = set()  # the one element of each server table's parameter


_LIKE = {torch.full_like, torch.zeros_like, torch.ones_like, torch.empty_like}


class _TableParameter(torch.nn.Parameter):
    """A server table's parameter: ``torch.*_like`` of it gives one element expanded to
    its shape, as the parameter itself is, never a tensor of the table's size (an
    optimizer's eager state, Adagrad's accumulator: the servers keep the real one). Every
    other function sees a plain tensor."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _LIKE and args and isinstance(args[0], _TableParameter):
            p = args[0]
            fill = args[1] if func is torch.full_like else int(func is torch.ones_like)
            one = torch.full((1,), fill, dtype=kwargs.get("dtype") or p.dtype)
            return one.expand(p.shape)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def eager_state(p: torch.Tensor, state: Any) -> bool:
    """Whether ``state`` is what an optimizer made of server table ``p`` at its start
    (every tensor one element expanded, by :class:`_TableParameter`): the servers'
    optimizer makes the same, so it need not travel. Pure."""
    return is_table(p) and all(
        not isinstance(t, torch.Tensor) or t.dim() == 0 or not any(t.stride())
        for t in dict(state).values()
    )


@dataclasses.dataclass(frozen=True)
class TableInit:
    """How a server table's values start: ``normal(mean, std)`` (torch's embeddings'
    ``N(0, 1)`` by default) drawn in blocks of :data:`BLOCK` elements, each from a
    generator seeded with ``seed`` and the block's number; row ``padding_idx`` zero."""

    seed: int = 0
    mean: float = 0.0
    std: float = 1.0
    padding_idx: int | None = None


def table_parameter(
    rows: int, dim: int, dtype: torch.dtype, init: TableInit, hot: Any
) -> torch.nn.Parameter:
    """A server table's parameter: shape ``[rows, dim]``, one element of memory, with
    the worker's ``hot`` rows of it (:func:`hot_of`). Pure."""
    p = _TableParameter(torch.zeros(1, dtype=dtype).expand(rows, dim))
    _POINTERS.add(p.data_ptr())
    setattr(p, _ATTR, init)
    setattr(p, _HOT, hot)
    return p


def hot_of(p: torch.Tensor) -> Any:
    """The hot rows a worker holds of server table ``p`` (a
    :class:`~trimtab.frontend.hotrows.HotRows`), or None for any other tensor."""
    return getattr(p, _HOT, None)


def holds_table(t: torch.Tensor) -> bool:
    """Whether ``t`` is a server table's parameter or a view of it (``state_dict()``'s
    detached one): a tensor to leave out of broadcasts, whose values are elsewhere."""
    return is_table(t) or (
        t.data_ptr() in _POINTERS and t.numel() > 1 and all(s == 0 for s in t.stride())
    )


def is_table(p: torch.Tensor) -> bool:
    """Whether ``p`` is a server table's parameter (:func:`table_parameter`)."""
    return hasattr(p, _ATTR)


def link(p: torch.Tensor, pusher: Any) -> None:
    """Make server table ``p`` read and push through ``pusher`` (its optimizer's)."""
    setattr(p, _LINK, pusher)


def linked(p: torch.Tensor) -> Any:
    """The pusher :func:`link` gave server table ``p``. Raises :class:`UsageError`
    before any optimizer declared it."""
    pusher = getattr(p, _LINK, None)
    if pusher is None:
        raise UsageError(
            "a trimtab.nn table lives on the servers: build trimtab.DistributedOptimizer "
            "over the model's parameters (after trimtab.init()) before its first forward"
        )
    return pusher


def init_values(
    shape: tuple[int, ...], init: TableInit, offset: int, numel: int, dtype: torch.dtype
) -> torch.Tensor:
    """The starting values of elements ``[offset, offset + numel)`` of a server table
    of ``shape`` that starts as ``init`` says. Pure: the same for every call."""
    first, end = offset // BLOCK, (offset + numel + BLOCK - 1) // BLOCK
    blocks = []
    for b in range(first, end):
        g = torch.Generator().manual_seed(init.seed * 1_000_003 + b)
        block = torch.empty(BLOCK, dtype=dtype)
        blocks.append(block.normal_(init.mean, init.std, generator=g))
    values = torch.cat(blocks)[offset - first * BLOCK : offset - first * BLOCK + numel]
    if init.padding_idx is not None:
        width = width_of(shape)
        row = init.padding_idx % shape[0]
        lo, hi = max(row * width - offset, 0), min((row + 1) * width - offset, numel)
        if lo < hi:
            values[lo:hi] = 0
    return values.clone()


def chunk_init(p: torch.Tensor, c: ChunkSpec) -> torch.Tensor:
    """Chunk ``c``'s starting values of server table ``p``. Pure."""
    init: TableInit = getattr(p, _ATTR)
    return init_values(tuple(p.shape), init, c.offset, c.numel, TORCH_DTYPES[c.dtype])


def row_requests(
    p: torch.Tensor, chunks: list[ChunkSpec], ids: torch.Tensor, epoch: int
) -> list[tuple[ChunkSpec, Any, list[Any], torch.Tensor]]:
    """The row PULLs that read rows ``ids`` (unique, sorted) of table ``p``: one per
    chunk any of them reaches into, ``(chunk, header, frames, its ids)``. Pure."""
    width = width_of(tuple(p.shape))
    spans = [row_span(width, c.offset, c.numel) for c in chunks]
    bounds = torch.searchsorted(ids, torch.tensor(spans, dtype=ids.dtype).view(-1)).tolist()
    out = []
    for i, c in enumerate(chunks):
        lo, hi = bounds[2 * i], bounds[2 * i + 1]  # (one search for every chunk)
        if lo == hi:
            continue
        mine = ids[lo:hi].contiguous()
        header = headers.pull(chunk=c.id, epoch=epoch)
        header["sr"] = mine.numel()
        out.append((c, header, [as_bytes(mine)], mine))
    return out


def rows_from(
    p: torch.Tensor,
    ids: torch.Tensor,
    answered: list[tuple[ChunkSpec, torch.Tensor, Reply]],
) -> torch.Tensor:
    """Rows ``ids`` of table ``p`` (``[len(ids), *p.shape[1:]]``) from the answers to
    :func:`row_requests` (``(chunk, its ids, reply)``). Raises :class:`UsageError` for
    an answer that does not add up (a server out of protocol). Pure."""
    width = width_of(tuple(p.shape))
    out = torch.empty(ids.numel() * width, dtype=p.dtype)
    for c, mine, reply in answered:
        h = reply.header
        positions = elements(mine, width, c.offset, c.numel) + c.offset
        frames = reply.frames
        if h.get("sr") != mine.numel() or len(frames) != 2:
            raise UsageError(f"chunk {c.id}: a row answer for {mine.numel()} rows is malformed")
        values = torch.frombuffer(bytearray(frames[1]), dtype=TORCH_DTYPES[str(h.get("dt"))])
        if values.numel() != positions.numel():
            raise UsageError(f"chunk {c.id}: {mine.numel()} rows answered with {values.numel()}")
        local = torch.searchsorted(ids, positions // width) * width + positions % width
        out[local] = values.to(p.dtype)
    return out.view(ids.numel(), *p.shape[1:])
