"""Straggler detection: which workers lag, from their clocks and step times.

Pure: a detector looks at each worker's latest clock and recent step times and names
the stragglers. SaPS uses it to tell a straggler to refresh its parameters and skip
ahead instead of pushing stale work.
"""

from __future__ import annotations

import abc
import dataclasses
import statistics
from collections.abc import Mapping
from typing import ClassVar

from trimtab.core.registry import Registry


class StragglerDetector(abc.ABC):
    """Names the stragglers. Implementations may keep per-worker streak counters."""

    name: ClassVar[str]

    @abc.abstractmethod
    def stragglers(self, clocks: Mapping[int, int]) -> set[int]:
        """Workers that are stragglers now, given each worker's latest reported clock."""


DETECTORS: Registry[StragglerDetector] = Registry("straggler detection")

#: The detector SaPS runs (no setting picks another yet).
DEFAULT_DETECTOR = "lag"


@DETECTORS.register("lag")
@dataclasses.dataclass
class LagDetector(StragglerDetector):
    """A worker is a straggler when its lag behind the leader (in clocks) exceeds both
    ``min_lag`` and ``k`` times the median lag, for ``patience`` consecutive checks."""

    name: ClassVar[str] = "lag"
    min_lag: int = 3
    k: float = 2.0
    patience: int = 2
    _streak: dict[int, int] = dataclasses.field(default_factory=dict)

    def stragglers(self, clocks: Mapping[int, int]) -> set[int]:
        if not clocks:
            return set()
        lead = max(clocks.values())
        lags = {w: lead - c for w, c in clocks.items()}
        median = statistics.median(lags.values())
        out = set()
        for w, lag in lags.items():
            if lag > self.min_lag and lag > self.k * median:
                self._streak[w] = self._streak.get(w, 0) + 1
            else:
                self._streak[w] = 0
            if self._streak[w] >= self.patience:
                out.add(w)
        return out
