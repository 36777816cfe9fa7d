"""A change test on a speed figure's latest windows (pure): has the server's speed moved
to a new level, or is the window noise?

A median of the last five windows ignores one wild window but follows a real change
only once three windows show it. This test judges the latest window against the
windows of the current level: a window further from their median than the server's
noise allows (``spread`` times the median distance of its recent windows from their
level, in log space, and at least a factor ``min_ratio``) is *out*; ``confirm`` windows
out in a row, on the same side, are a change, and the level restarts from them. With
``confirm=2`` and a window a step, a slowdown that starts at step s is seen at step
s + 1: within two steps. The noise is the server's own and outlives a change (a
server's windows scatter alike, in proportion, at any speed); the level's median is
judged by once it has ``history`` windows again, so that the windows that made a
change do not make its median.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics


@dataclasses.dataclass(frozen=True)
class ChangeSettings:
    """The change test's thresholds.

    Attributes:
        keep: the level's latest windows whose median is the figure.
        judge_keep: the level's latest windows whose median a window is judged
            against (>= keep: a longer median moves less by chance, and a window out
            twice in a row by chance against a median of five was common).
        min_ratio: a window within this factor of the level's median is never out,
            however steady the level was (> 1).
        spread: a window is out beyond this many times the noise: the median distance
            (log space) of the server's recent windows from their level (> 0).
        confirm: windows out in a row, on the same side, that make a change (>= 1).
        history: windows a level needs before a window can be out (>= 2; above
            ``confirm``, or the windows of a change would be judged by themselves).
        noise_keep: recent windows' distances kept for the noise.
    """

    keep: int = 5
    judge_keep: int = 16
    min_ratio: float = 1.5
    spread: float = 5.0
    confirm: int = 2
    history: int = 5
    noise_keep: int = 64

    def __post_init__(self) -> None:
        if self.judge_keep < self.keep or self.keep < self.history or self.history < 2:
            raise ValueError(f"need keep >= history >= 2, got {self.keep}, {self.history}")
        if (
            not self.min_ratio > 1
            or not self.spread > 0
            or not 1 <= self.confirm < self.history
            or self.noise_keep < 1
        ):
            raise ValueError(f"bad change-test thresholds: {self}")


class LevelTracker:
    """One server's speed level, from its windows (bytes per busy second).

    Not thread-safe. Never blocks.

    Attributes:
        changes: changes detected so far.
    """

    def __init__(self, settings: ChangeSettings | None = None) -> None:
        self.settings = settings or ChangeSettings()
        self._level: collections.deque[float] = collections.deque(maxlen=self.settings.judge_keep)
        # Distances (log space) of the windows judged from their level's median.
        self._noise: collections.deque[float] = collections.deque(maxlen=self.settings.noise_keep)
        self._out: list[float] = []  # windows out in a row, on one side
        self._side = 0
        self.changes = 0

    def __len__(self) -> int:
        return len(self._level)

    def figure(self) -> float | None:
        """The current level: the median of its windows (None before any)."""
        keep = self.settings.keep
        return statistics.median(list(self._level)[-keep:]) if self._level else None

    def error(self) -> float | None:
        """The figure's relative standard error (log space), or None with fewer than two
        windows: one window's scatter (1.4826 times the median distance of the windows
        judged from their level; before any was judged, of the level's own windows from
        their median) times 1.2533 (a median's) over the root of the windows the figure
        is the median of. Two servers whose figures differ by less than this are not
        told apart by their windows."""
        level = list(self._level)[-self.settings.keep :]
        if len(level) < 2:
            return None
        if len(self._noise) >= self.settings.history:
            scatter = statistics.median(self._noise)
        else:
            logs = [math.log(w) for w in level]
            centre = statistics.median(logs)
            scatter = statistics.median(abs(x - centre) for x in logs)
        return 1.4826 * 1.2533 * scatter / math.sqrt(len(level))

    def observe(self, window: float) -> bool:
        """Take a window (> 0); return whether it completes a change (the level then
        restarts from the windows that showed it)."""
        s = self.settings
        if len(self._level) < s.history:
            self._level.append(window)
            return False
        logs = [math.log(w) for w in self._level]
        centre = statistics.median(logs)
        if len(self._noise) < s.history:  # no noise known yet: the level's own spread
            self._noise.extend(abs(x - centre) for x in logs)
        band = max(math.log(s.min_ratio), s.spread * statistics.median(self._noise))
        off = math.log(window) - centre
        # Every window judged counts, out or in: the noise of the windows judged in
        # only is cut at the band, and a band made of it shrank to its floor.
        self._noise.append(abs(off))
        side = 0 if abs(off) <= band else (1 if off > 0 else -1)
        if side == 0:
            self._out, self._side = [], 0
            self._level.append(window)
            return False
        if side != self._side:
            self._out, self._side = [], side
        self._out.append(window)
        if len(self._out) < s.confirm:
            return False  # one odd window: not yet a change, nor part of the level
        self._level.clear()
        self._level.extend(self._out)
        self._out, self._side = [], 0
        self.changes += 1
        return True
