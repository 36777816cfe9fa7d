"""A server's side of a growing table: the id -> row map of each of its chunks, read
by row PULLs that carry ids of any 64-bit value (``gw``), and carried with the chunk.

A growing table's chunk is a bucket of rows (those wholly inside it: a row that
straddles two chunks is never given out); the worker sends each id to its bucket's
server (:func:`trimtab.policies.growth.bucket_of` on the worker's side). A read counts a
sighting of each id, admits and evicts as the table's :class:`Growth` says (the pure
:class:`~trimtab.policies.growth.RowMap`, stepped by the chunk's round), starts each row
given to an id afresh (values drawn from the id, optimizer state zero) and answers each
id's row number (-1: not admitted) and elements (zeros for an id not admitted). The
pushes that follow name rows, as any table's do: nothing changes on the push path.

The map lives on the chunk's :class:`~trimtab.roles.server.optim.ChunkOptimizer`
(``grown``) and travels in its state (:func:`encode_grown`, keys ``grow.*``): a
migration, a replica's REPLICATE and a checkpoint carry it with the rows' values; a
worker's STATE_GET (``DistributedOptimizer.state_dict()``) does not. A replica holds the
map as of the chunk's last round: admissions by reads since are lost with a primary
that dies before its next round (their rows then start afresh at the backup).
Not thread-safe: the server's loop calls it. Nothing blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from trimtab.errors import ConfigError, ProtocolError
from trimtab.policies.growth import COUNTERS, Growth, RowMap, mix64
from trimtab.protocol.headers import PullHeader, StateMeta
from trimtab.protocol.messages import ErrorCode
from trimtab.roles.server.chunk import Chunk
from trimtab.runtime.rows import whole_rows
from trimtab.runtime.tensors import WIRE_DTYPES, as_bytes
from trimtab.transport import Frame

#: The state keys a growing table's map travels under (beside the optimizer's).
PREFIX = "grow."
_LISTS = ("ids", "rows", "seen", "pending", "sightings", "pending_seen")


@dataclasses.dataclass
class Grown:
    """A chunk's map and how its rows start: ``normal(mean, std)`` drawn from ``seed``
    and the id (:func:`fresh_row`); ``first``/``end``: the rows it gives out."""

    map: RowMap
    cap: int
    first: int
    end: int
    seed: int
    mean: float
    std: float

    def wire(self) -> list[Any]:
        return [self.map.growth.to_wire(), self.cap, self.first, self.end, self.seed,
                self.mean, self.std]  # fmt: skip


def fresh_row(seed: int, key: int, width: int, mean: float, std: float) -> torch.Tensor:
    """The starting elements of the row given to id ``key`` of a growing table whose
    rows start as ``normal(mean, std)`` from ``seed``: the same wherever and whenever it
    is given (so a row evicted and admitted again starts as it first did). Pure."""
    g = torch.Generator().manual_seed(mix64(key ^ mix64(seed)) >> 1)
    return torch.empty(width).normal_(mean, std, generator=g)


def _bad(why: str, code: ErrorCode = ErrorCode.MALFORMED) -> ProtocolError:
    return ProtocolError(code.value, why)


def _grown_of(chunk: Chunk, width: int, raw: Any) -> Grown:
    """The chunk's map, made at its first read (``raw``: the read's ``gw``). Raises
    MALFORMED for a bad ``gw`` or a chunk with no whole row, BAD_STATE in summation mode
    or where the chunk's map follows other rules."""
    opt = chunk.optimizer
    if opt is None:
        raise _bad("a growing table needs an optimizer on the servers", ErrorCode.BAD_STATE)
    try:
        if not isinstance(raw, list) or len(raw) != 4:
            raise ConfigError("'gw' is [growth, cap, seed, [mean, std]]")
        growth, cap, seed, (mean, std) = Growth.from_wire(raw[0]), raw[1], raw[2], raw[3]
        if type(cap) is not int or type(seed) is not int or cap < 0:
            raise ConfigError("'gw': the cap and seed must be ints")
        mean, std = float(mean), float(std)
    except (ConfigError, TypeError, ValueError) as e:
        raise _bad(f"chunk {chunk.spec.id}: {e}") from None
    first, end = whole_rows(width, chunk.spec.offset, chunk.spec.numel)
    if first >= end:
        raise _bad(f"chunk {chunk.spec.id} holds no whole row of a growing table")
    grown: Grown | None = opt.grown
    if grown is None:
        grown = Grown(RowMap(growth, range(first, end), cap), cap, first, end, seed, mean, std)
        opt.grown = grown
    elif grown.wire() != Grown(grown.map, cap, first, end, seed, mean, std).wire() or (
        grown.map.growth != growth
    ):
        raise _bad(f"chunk {chunk.spec.id}: the table grows by other rules", ErrorCode.BAD_STATE)
    return grown


def read_grown(
    chunk: Chunk, width: int, msg: PullHeader, frames: Sequence[memoryview]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Answer a growing read (``msg`` with ``sr`` and ``gw``; ``frames``: its ids, int64,
    strictly increasing): each id's row (-1: not admitted) and the rows' elements
    (zeros for -1), admitting, evicting and starting rows afresh as the map says.
    Raises MALFORMED for a bad frame or ids, as :func:`_grown_of`; nothing changed then."""
    grown = _grown_of(chunk, width, msg.get("gw"))
    count = msg.get("sr", 0)
    frame = frames[0] if len(frames) == 1 else memoryview(b"")
    if count < 1 or frame.nbytes != 8 * count:
        raise _bad(f"{count} ids need one frame of {8 * count} bytes")
    keys = torch.frombuffer(bytearray(frame), dtype=torch.int64)
    if bool((keys[1:] <= keys[:-1]).any()):
        raise _bad("a growing read's ids must be strictly increasing")
    listed = keys.tolist()
    rows, fresh = grown.map.see(listed, chunk.round)
    if fresh:
        given = set(fresh)
        _restart(
            chunk, width, grown, [(k, r) for k, r in zip(listed, rows, strict=True) if r in given]
        )
    slots = torch.tensor(rows, dtype=torch.int64)
    values = torch.zeros(count, width, dtype=chunk.value.dtype)
    held = slots >= 0
    if bool(held.any()):
        at = slots[held].view(-1, 1) * width + torch.arange(width) - chunk.spec.offset
        values[held] = chunk.value[at.view(-1)].view(-1, width)
    return slots, values.view(-1)


def _restart(chunk: Chunk, width: int, grown: Grown, given: list[tuple[int, int]]) -> None:
    """Start rows afresh for the ids given them: values drawn anew, optimizer state
    as at the start (Adagrad's accumulator its initial value, the rest zero)."""
    opt = chunk.optimizer
    assert opt is not None
    at = torch.tensor([r for _, r in given]).view(-1, 1) * width + torch.arange(width)
    at = at.view(-1) - chunk.spec.offset
    fresh = [fresh_row(grown.seed, k, width, grown.mean, grown.std) for k, _ in given]
    chunk.value[at] = torch.cat(fresh).to(chunk.value.dtype)
    start = float(opt.optimizer.param_groups[0].get("initial_accumulator_value", 0.0))
    for key, t in opt.optimizer.state.get(opt.param, {}).items():
        if isinstance(t, torch.Tensor) and t.numel() == chunk.spec.numel:
            t.view(-1)[at] = start if key == "sum" else 0.0


def counters(chunk: Chunk) -> list[int] | None:
    """A growing chunk's counters (:data:`~trimtab.policies.growth.COUNTERS`, then the
    live rows) for a reply's ``gc``; None for any other chunk."""
    grown = None if chunk.optimizer is None else chunk.optimizer.grown
    if grown is None:
        return None
    c = grown.map.counters()
    return [c[k] for k in (*COUNTERS, "live")]


def totals(chunks: Iterable[Chunk]) -> dict[str, int]:
    """The growing tables' counters summed over ``chunks`` (empty: none grows), for a
    server's stats."""
    names = (*COUNTERS, "live")
    out: dict[str, int] = {}
    for chunk in chunks:
        values = counters(chunk)
        for name, v in zip(names, values or (), strict=False):
            out[name] = out.get(name, 0) + v
    return out


def encode_grown(grown: Grown, meta: StateMeta, frames: list[Frame]) -> None:
    """Add the map to a chunk's state (``meta`` and its ``frames``), as ``grow.*``."""
    state = grown.map.export()
    meta[PREFIX + "cfg"] = ["v", grown.wire()]
    meta[PREFIX + "counters"] = ["v", state["counters"]]
    for key in _LISTS:
        # int64 travels as float64's bytes (the wire has no integer dtype); only copied.
        t = torch.tensor(state[key], dtype=torch.int64).view(torch.float64)
        meta[PREFIX + key] = ["t", WIRE_DTYPES[t.dtype], [t.numel()]]
        frames.append(as_bytes(t) if t.numel() else b"")


def _ints(t: torch.Tensor) -> list[int]:
    if t.numel() == 0:
        return []
    if t.dtype != torch.float64:
        raise ValueError(f"a list travels as float64's bytes, not {t.dtype}")
    out: list[int] = t.reshape(-1).view(torch.int64).tolist()
    return out


def take_grown(state: dict[str, Any]) -> tuple[dict[str, Any], Grown | None]:
    """Split a decoded chunk state into the optimizer's and the map (None: none).
    Raises a MALFORMED :class:`ProtocolError` for a map that does not fit."""
    mine = {k[len(PREFIX) :]: state[k] for k in state if k.startswith(PREFIX)}
    rest = {k: v for k, v in state.items() if not k.startswith(PREFIX)}
    if not mine:
        return rest, None
    try:
        raw, cap, first, end, seed, mean, std = mine["cfg"]
        lists = {k: _ints(mine[k]) for k in _LISTS}
        growth = Growth.from_wire(raw)
        rows = RowMap.restore(
            growth, range(first, end), cap, {**lists, "counters": list(mine["counters"])}
        )
        return rest, Grown(rows, cap, first, end, seed, float(mean), float(std))
    except (ConfigError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise _bad(f"a growing table's map in a chunk's state does not fit: {e}") from None
