"""Growing tables: which 64-bit ids get a row, and which rows are given back.

A growing table (``trimtab.nn.EmbeddingBag(..., growing=Growth(...))``) maps ids of any
64-bit value to rows on first sight. Each row block of the table (a chunk) is a bucket:
an id belongs to the bucket :func:`bucket_of` says, and the bucket's server keeps the id
-> row map of its rows (a :class:`RowMap`, which moves, is replicated and checkpointed
with the chunk's optimizer state). Three optional rules, each with its counter:

- **admission after N sightings** (Paddle's ``CountFilterEntry``): an id gets a row on
  its ``admit_after``-th sighting (a read of it by a worker); until then it reads as a
  zero row and its gradient is dropped (``refused`` counts those sightings);
- **probability admission** (XDL): each sighting that reaches the count admits with
  probability ``admit_prob``, decided by a hash of the id and the sighting (the same on
  every replica and rerun, no random state);
- **eviction** (TorchRec): a row unseen for more than ``ttl_steps`` steps is given back
  (``evicted``), and a bucket at its share of ``max_rows`` gives back its least recently
  seen row to admit a new id (``evicted_for_cap``), never a row seen in the current step
  (a gradient for it may be on its way); with none to give, the id is refused (``full``).

A row given back and admitted again starts afresh (its values drawn anew, its optimizer
state zero). Pure: no clock (steps are passed in), no I/O, no torch. Not thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trimtab.errors import ConfigError

_MASK = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class Growth:
    """How a growing table admits and evicts rows (every rule optional).

    Attributes:
        admit_after: sightings of an id before it gets a row (1: on first sight).
        admit_prob: the chance that a sighting reaching ``admit_after`` admits (1: always).
        ttl_steps: a row unseen for more than this many steps is evicted (0: never).
        max_rows: the most live rows in the table (0: as many as it has rows).
        seed: the seed of probability admission's hash.
    """

    admit_after: int = 1
    admit_prob: float = 1.0
    ttl_steps: int = 0
    max_rows: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("admit_after", "ttl_steps", "max_rows", "seed"):
            v = getattr(self, name)
            if type(v) is not int:
                raise ConfigError(f"Growth.{name} must be an int, got {v!r}")
        if self.admit_after < 1:
            raise ConfigError(
                f"Growth.admit_after must be at least 1 (1: a row on first sight), "
                f"got {self.admit_after}"
            )
        p = self.admit_prob
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
            raise ConfigError(f"Growth.admit_prob must be in (0, 1], got {p!r}")
        if self.ttl_steps < 0:
            raise ConfigError(
                f"Growth.ttl_steps must be >= 0 (0: never evict), got {self.ttl_steps}"
            )
        if self.max_rows < 0:
            raise ConfigError(
                f"Growth.max_rows must be >= 0 (0: the table's rows), got {self.max_rows}"
            )

    def to_wire(self) -> list[Any]:
        return [self.admit_after, float(self.admit_prob), self.ttl_steps, self.max_rows, self.seed]

    @classmethod
    def from_wire(cls, raw: Any) -> Growth:
        """Parse :meth:`to_wire`'s list. Raises :class:`ConfigError` with what is wrong."""
        if not isinstance(raw, list | tuple) or len(raw) != 5:
            raise ConfigError(
                f"a growth setting is [admit_after, prob, ttl, max_rows, seed], got {raw!r}"
            )
        a, p, t, m, s = raw
        return cls(a, p, t, m, s)


def mix64(x: int) -> int:
    """splitmix64's finaliser of ``x`` (any int, taken modulo 2^64): an unsigned 64-bit
    hash. Pure."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def admits(growth: Growth, key: int, sighting: int) -> bool:
    """Whether sighting number ``sighting`` of id ``key`` admits it by probability.
    Pure: the same answer everywhere."""
    if growth.admit_prob >= 1.0:
        return True
    h = mix64(mix64(key ^ (growth.seed * 0x9E3779B97F4A7C15)) + sighting)
    return h < growth.admit_prob * 2.0**64


def caps(max_rows: int, slots: Sequence[int]) -> list[int]:
    """Each bucket's share of ``max_rows`` live rows (0: no cap below its slots), given
    each bucket's ``slots``: proportional, summing to ``max_rows`` exactly (or to the
    slots, where fewer). Pure."""
    total = sum(slots)
    if max_rows <= 0 or max_rows >= total:
        return list(slots)
    out, before = [], 0
    for n in slots:
        out.append(max_rows * (before + n) // total - max_rows * before // total)
        before += n
    return out


#: The counters a :class:`RowMap` keeps (and exports), in this order.
COUNTERS = ("admitted", "refused", "evicted", "evicted_for_cap", "full")


class RowMap:
    """The id -> row map of one bucket (the rows ``slots`` of a table), under a
    :class:`Growth`'s rules with at most ``cap`` live rows. Not thread-safe."""

    def __init__(self, growth: Growth, slots: Iterable[int], cap: int) -> None:
        self.growth = growth
        self.slots = list(slots)
        self.cap = min(cap, len(self.slots))
        #: id -> row, oldest sighting first (the order eviction takes them in).
        self.rows: OrderedDict[int, int] = OrderedDict()
        self.last_seen: dict[int, int] = {}
        #: ids not admitted yet: id -> [sightings, last step seen], oldest first.
        self.pending: OrderedDict[int, list[int]] = OrderedDict()
        self._free = list(reversed(self.slots))  # pop() gives the lowest row first
        self.counts = dict.fromkeys(COUNTERS, 0)

    @property
    def live(self) -> int:
        return len(self.rows)

    def counters(self) -> dict[str, int]:
        """The counters and the live rows."""
        return {**self.counts, "live": self.live}

    def see(self, keys: Sequence[int], step: int) -> tuple[list[int], list[int]]:
        """A read of ids ``keys`` at ``step``: evicts what the time to live says, counts
        a sighting of each, admits what the rules admit. Returns each id's row (-1: not
        admitted: it reads as zeros, its gradient is dropped) and the rows given to an
        id now (to start afresh)."""
        self.expire(step)
        out, fresh = [], []
        for key in keys:
            row = self.rows.get(key)
            if row is not None:
                self.rows.move_to_end(key)
                self.last_seen[key] = step
                out.append(row)
                continue
            row = self._admit(key, step)
            out.append(row)
            if row >= 0:
                fresh.append(row)
        self._trim_pending()
        return out, fresh

    def _admit(self, key: int, step: int) -> int:
        seen = self.pending.pop(key, None) or [0, step]
        seen[0] += 1
        seen[1] = step
        if seen[0] < self.growth.admit_after or not admits(self.growth, key, seen[0]):
            self.pending[key] = seen
            self.counts["refused"] += 1
            return -1
        if len(self.rows) >= self.cap or not self._free:
            oldest = next(iter(self.rows), None)
            if oldest is None or self.last_seen[oldest] >= step:
                self.pending[key] = seen  # (a later sighting may find room)
                self.counts["refused"] += 1
                self.counts["full"] += 1
                return -1
            self._free.append(self._drop(oldest))
            self.counts["evicted_for_cap"] += 1
        row = self._free.pop()
        self.rows[key] = row
        self.last_seen[key] = step
        self.counts["admitted"] += 1
        return row

    def _drop(self, key: int) -> int:
        del self.last_seen[key]
        return self.rows.pop(key)

    def expire(self, step: int) -> list[int]:
        """Evict the rows unseen for more than ``ttl_steps`` before ``step`` (none with
        no time to live). Returns the rows given back."""
        ttl = self.growth.ttl_steps
        out: list[int] = []
        if ttl <= 0:
            return out
        while self.rows:
            key = next(iter(self.rows))
            if step - self.last_seen[key] <= ttl:
                break
            row = self._drop(key)
            self._free.append(row)
            out.append(row)
            self.counts["evicted"] += 1
        for key in [k for k, (_, last) in self.pending.items() if step - last > ttl]:
            del self.pending[key]
        return out

    def _trim_pending(self) -> None:
        # Counts of ids not admitted are bounded: the oldest go first past 4 per row.
        while len(self.pending) > 4 * max(len(self.slots), 1):
            self.pending.popitem(last=False)

    def export(self) -> dict[str, list[int]]:
        """The map as lists of ints (ids, rows, steps; pending ids, sightings, steps;
        the counters), for :meth:`restore`. Pure."""
        keys = list(self.rows)
        return {
            "ids": keys,
            "rows": [self.rows[k] for k in keys],
            "seen": [self.last_seen[k] for k in keys],
            "pending": list(self.pending),
            "sightings": [v[0] for v in self.pending.values()],
            "pending_seen": [v[1] for v in self.pending.values()],
            "counters": [self.counts[c] for c in COUNTERS],
        }

    @classmethod
    def restore(
        cls, growth: Growth, slots: Iterable[int], cap: int, state: Mapping[str, Sequence[int]]
    ) -> RowMap:
        """A map as :meth:`export` left it. Raises :class:`ValueError` for a state that
        does not fit (lists of different lengths, rows not among ``slots`` or twice)."""
        out = cls(growth, slots, cap)
        keys, rows, seen = state["ids"], state["rows"], state["seen"]
        pending, counts, last = state["pending"], state["sightings"], state["pending_seen"]
        if not len(keys) == len(rows) == len(seen) or not len(pending) == len(counts) == len(last):
            raise ValueError("a growing table's map: its lists differ in length")
        if len(set(rows)) != len(rows) or not set(rows) <= set(out.slots):
            raise ValueError("a growing table's map names rows outside its bucket, or twice")
        if len(state["counters"]) != len(COUNTERS):
            raise ValueError(f"a growing table's map has {len(state['counters'])} counters")
        for k, r, s in zip(keys, rows, seen, strict=True):
            out.rows[k], out.last_seen[k] = r, s
        for k, n, s in zip(pending, counts, last, strict=True):
            out.pending[k] = [n, s]
        used = set(rows)
        out._free = [r for r in reversed(out.slots) if r not in used]
        out.counts = dict(zip(COUNTERS, state["counters"], strict=True))
        return out
