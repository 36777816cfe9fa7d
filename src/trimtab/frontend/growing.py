"""A worker's side of a growing table: ids of any 64-bit value read through their
buckets' servers, which map them to rows (roles/server/growing.py).

Each chunk of the table with a whole row is a bucket; :func:`bucket_of` sends an id to
one (a hash of the id modulo the buckets: the same on every worker, whatever the
placement, so a bucket's map moves with its chunk). A read answers each id's row (-1:
not admitted, its elements zero) and the bucket's counters; the forward then works in
row numbers, so the gradient the optimizer pushes names rows as any table's does, the
ids not admitted left out (their gradient dropped, counted here). Not thread-safe: the
training thread uses it.
"""

from __future__ import annotations

from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec
from trimtab.errors import ConfigError, UsageError
from trimtab.frontend.tables import TableInit
from trimtab.policies.growth import COUNTERS, Growth, caps
from trimtab.protocol import headers
from trimtab.runtime.rows import whole_rows
from trimtab.runtime.tensors import TORCH_DTYPES, as_bytes

_M1 = -7046029254386353131  # 0x9E3779B97F4A7C15 as an int64
_M2 = -4658895280553007687  # 0xBF58476D1CE4E5B9 as an int64


def bucket_of(keys: torch.Tensor, buckets: int) -> torch.Tensor:
    """The bucket (0 to ``buckets`` - 1) of each id of ``keys`` (int64): a multiply
    and xor-shift hash (int64 arithmetic wraps), so that consecutive ids spread. Pure."""
    h = keys.to(torch.int64) * _M1
    h = h ^ ((h >> 32) & 0xFFFFFFFF)
    h = h * _M2
    h = h ^ ((h >> 29) & ((1 << 35) - 1))
    return h.remainder(buckets)


def check_growth(growing: Any, rows: int, hot_rows: int, padding_idx: int | None) -> Growth:
    """``growing`` checked for a table of ``rows`` rows. Raises :class:`ConfigError`
    saying what to change."""
    if not isinstance(growing, Growth):
        raise ConfigError(
            f"growing must be a trimtab.nn.Growth (e.g. Growth(admit_after=2, ttl_steps=100)), "
            f"got {growing!r}"
        )
    if growing.max_rows > rows:
        raise ConfigError(
            f"Growth.max_rows ({growing.max_rows}) exceeds the table's {rows} rows: "
            "num_embeddings is the rows the servers hold; make it at least max_rows"
        )
    if hot_rows:
        raise ConfigError("a growing table cannot replicate hot rows yet: leave hot_rows 0")
    if padding_idx is not None:
        raise ConfigError("a growing table has no padding row (ids are not rows): leave it None")
    return growing


class GrowingRows:
    """The reads of one growing table of ``shape`` whose rows start as ``init``, and
    the counters its buckets' servers last answered."""

    def __init__(self, growth: Growth, shape: tuple[int, int], init: TableInit) -> None:
        self.growth, self.shape, self.init = growth, shape, init
        self._buckets: list[tuple[ChunkSpec, int]] = []
        self._for: tuple[int, ...] = ()
        #: Each bucket's counters as its server last answered (chunk id -> list).
        self.counters: dict[int, list[int]] = {}
        #: Gradient rows left out because their id was not admitted.
        self.dropped = 0

    def buckets(self, chunks: list[ChunkSpec]) -> list[tuple[ChunkSpec, int]]:
        """The table's buckets, ``(chunk, its cap)``, in chunk order. Raises
        :class:`UsageError` where no chunk holds a whole row."""
        key = tuple(c.id for c in chunks)
        if key != self._for:
            width = self.shape[1]
            spans = [whole_rows(width, c.offset, c.numel) for c in chunks]
            held = [(c, end - first) for c, (first, end) in zip(chunks, spans, strict=True)]
            held = [(c, n) for c, n in held if n > 0]
            if not held:
                raise UsageError("a growing table's chunks hold no whole row: raise chunk_bytes")
            shares = caps(self.growth.max_rows, [n for _, n in held])
            self._buckets = [(c, cap) for (c, _), cap in zip(held, shares, strict=True)]
            self._for = key
        return self._buckets

    def read(
        self, pusher: Any, p: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows for ids ``keys`` (unique, sorted): each one's row number (-1: not
        admitted) and elements (``[len(keys), dim]``). Blocks; raises as
        :meth:`Pusher.ask`, and :class:`UsageError` for an answer that does not add up."""
        buckets = self.buckets(pusher.chunks_of[p])
        which = bucket_of(keys, len(buckets))
        init = self.init
        asked = []
        for i, (c, cap) in enumerate(buckets):
            at = (which == i).nonzero().view(-1)
            if at.numel() == 0:
                continue
            mine = keys[at].contiguous()
            header = headers.pull(chunk=c.id, epoch=pusher.epoch)
            header["sr"] = mine.numel()
            header["gw"] = [self.growth.to_wire(), cap, init.seed, [init.mean, init.std]]
            asked.append((c, header, [as_bytes(mine)], at))
        replies = pusher.ask([(c, h, f) for c, h, f, _ in asked])
        width = self.shape[1]
        slots = torch.empty(keys.numel(), dtype=torch.int64)
        rows = torch.empty(keys.numel(), width, dtype=p.dtype)
        for (c, _, _, at), reply in zip(asked, replies, strict=True):
            h, frames = reply.header, reply.frames
            n = at.numel()
            if h.get("sr") != n or len(frames) != 2 or frames[0].nbytes != 8 * n:
                raise UsageError(f"chunk {c.id}: a growing read of {n} ids is answered malformed")
            values = torch.frombuffer(bytearray(frames[1]), dtype=TORCH_DTYPES[str(h.get("dt"))])
            if values.numel() != n * width:
                raise UsageError(f"chunk {c.id}: {n} ids answered with {values.numel()} elements")
            slots[at] = torch.frombuffer(bytearray(frames[0]), dtype=torch.int64)
            rows[at] = values.view(n, width).to(p.dtype)
            if isinstance(h.get("gc"), list):
                self.counters[c.id] = list(h["gc"])
        return slots, rows

    def report(self) -> dict[str, int]:
        """The table's counters: admitted, refused (sightings that admitted nothing),
        evicted (time to live), evicted_for_cap, full (refused for want of room), live
        rows, summed over the buckets as their servers last answered this worker; and
        ``dropped``, this worker's gradient rows left out."""
        names = (*COUNTERS, "live")
        out = dict.fromkeys(names, 0)
        for values in self.counters.values():
            for name, v in zip(names, values, strict=False):
                out[name] += int(v)
        out["dropped"] = self.dropped
        return out
