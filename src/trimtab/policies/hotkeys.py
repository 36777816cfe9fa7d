"""Which rows of a table are hot (NuPS): replicated on the workers, kept in step by the
servers' answers, read without a round trip.

Under a skewed access (a bounded Zipf(1.1) over 10^6 rows: the top 0.1% take ~69% of the
reads) a small hot set carries most reads. The policy picks the top N rows by measured
access count, refreshed as it shifts; a row already hot stays unless a candidate is
read ``margin`` times as often (hysteresis: a refresh that swaps near-ties pays reads
for nothing). Pure: a function of the counts, unit-tested alone and drivable by the
simulator. Nothing blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class HotKeys:
    """Settings of the hot set of one table.

    Attributes:
        size: the most rows held hot (N); 0 turns replication off (a classic row PS).
        refresh_steps: steps between two choices of the hot set.
        margin: a candidate displaces a hot row only if read this many times as often.
        decay: each refresh multiplies the counts by this (1: all history counts
            alike; below 1, recent reads weigh more, so the set follows a shift).
        min_rate: a row read in fewer than this share of the forwards is never hot
            (its count below :attr:`floor`): under uniform access no row is read often
            enough to pay for its replica, and the set stays empty.
    """

    size: int = 0
    refresh_steps: int = 10
    margin: float = 1.2
    decay: float = 0.5
    min_rate: float = 0.2

    def __post_init__(self) -> None:
        bad_rate = not 0 <= self.min_rate <= 1
        if self.size < 0 or self.refresh_steps < 1 or self.margin < 1 or bad_rate:
            raise ValueError(
                f"hot keys need size >= 0, refresh_steps >= 1, margin >= 1, min_rate in "
                f"[0, 1] and decay in (0, 1]; got {self}"
            )
        if not 0 < self.decay <= 1:
            raise ValueError(f"hot keys need decay in (0, 1]; got {self}")

    @property
    def floor(self) -> float:
        """The count a row read at :attr:`min_rate` reaches: the decayed sum over the
        windows (``rate x refresh_steps / (1 - decay)``; one window without decay)."""
        windows = 1.0 / (1.0 - self.decay) if self.decay < 1 else 1.0
        return self.min_rate * self.refresh_steps * windows


def choose_hot(
    candidates: Iterable[tuple[int, float]], current: Sequence[int], settings: HotKeys
) -> list[int]:
    """The next hot set (sorted row ids): the top ``settings.size`` of ``candidates``
    (``(row, count)``, any order; rows not among them count 0), where a row of
    ``current`` keeps its place unless an outside candidate counts more than ``margin``
    times its count; a row counting less than ``settings.floor`` (a held one: times the
    margin) is left out. Pure."""
    n = settings.size
    if n <= 0:
        return []
    counts = dict(candidates)
    held = set(current)
    # Each held row competes with its count raised by the margin: ties go to the held.
    ranked = sorted(
        counts.items() | {(r, counts.get(r, 0.0)) for r in held},
        key=lambda rc: (-(rc[1] * settings.margin if rc[0] in held else rc[1]), rc[0]),
    )
    floor = max(settings.floor, 1e-12)
    chosen = [r for r, c in ranked if c * (settings.margin if r in held else 1.0) >= floor][:n]
    return sorted(chosen)


def hit_rate(hits: int, reads: int) -> float:
    """The share of row reads served by the hot set (0 for no reads). Pure."""
    return hits / reads if reads else 0.0
