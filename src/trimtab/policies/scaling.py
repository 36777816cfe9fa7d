"""Server scaling policies: when a job should ask for one more server, and which idle one
it may give back.

Pure: a policy decides from the servers' speed figures (:mod:`trimtab.policies.psld`)
and the map, at step boundaries; the coordinator starts the migrations and asks the
launcher for processes. ``trimtab scale`` sets a count by hand, beside any policy.

- ``stragglers`` (what ``--placement psld`` runs): one more server while an active one
  runs below ``straggler_ratio`` of the median speed (its share of the load then has
  somewhere to go); give back a server that owns nothing, has owned nothing for
  ``idle_steps`` steps and straggles for good.
"""

from __future__ import annotations

import abc
import statistics
from collections.abc import Sequence
from typing import ClassVar

from trimtab.core.registry import Registry


class ScalingPolicy(abc.ABC):
    """Decides when to grow or shrink the set of active servers. Pure but for the
    state its class docstring names; no I/O. Not thread-safe."""

    name: ClassVar[str]

    @abc.abstractmethod
    def wants_server(self, speeds: Sequence[float] | None, active: Sequence[bool]) -> bool:
        """Whether the job should ask for one more server now. ``speeds`` are the
        servers' figures (None before any is measured), ``active[s]`` whether server
        ``s`` serves (neither draining nor retired)."""

    @abc.abstractmethod
    def idle_server(
        self,
        clock: int,
        owners: Sequence[int],
        active: Sequence[bool],
        lasting: frozenset[int],
        *,
        settled: bool = True,
    ) -> int | None:
        """An active server to drain and retire at step ``clock``, or None. ``lasting``
        are the servers that straggle for good; ``settled`` is False while the
        placement policy judges a tried map (a server it emptied may be refilled).
        Call it at every step boundary: a policy may count steps."""


SCALING: Registry[ScalingPolicy] = Registry("scaling")

#: The scaling policy a live placement runs (no setting picks another yet).
DEFAULT_SCALING = "stragglers"


@SCALING.register("stragglers")
class StragglerScaling(ScalingPolicy):
    """One more server while one straggles; give back a lasting straggler left idle.

    State: per active server that owns nothing, the step since which it has.

    Args:
        straggler_ratio: a server below this fraction of the median active speed
            straggles.
        idle_steps: steps a server must have owned nothing before it is given back
            (PSLD's trial window: a tried map that emptied it is judged by then).
        min_servers: never fewer active servers than this (the job's starting count:
            the servers it adds are the ones it may give back).
    """

    name = "stragglers"

    def __init__(
        self, *, straggler_ratio: float = 0.5, idle_steps: int = 5, min_servers: int = 1
    ) -> None:
        self.straggler_ratio = straggler_ratio
        self.idle_steps = idle_steps
        self.min_servers = min_servers
        self._empty_since: dict[int, int] = {}  # active server -> owns nothing since

    def wants_server(self, speeds: Sequence[float] | None, active: Sequence[bool]) -> bool:
        """True while an active server runs below ``straggler_ratio`` of the median
        active speed: adding a server gives its share of the load somewhere."""
        if speeds is None:
            return False
        live = [v for v, a in zip(speeds, active, strict=True) if a]
        if len(live) < 2:
            return False
        return min(live) < self.straggler_ratio * statistics.median(live)

    def idle_server(
        self,
        clock: int,
        owners: Sequence[int],
        active: Sequence[bool],
        lasting: frozenset[int],
        *,
        settled: bool = True,
    ) -> int | None:
        """An active server that owns nothing, has owned nothing for ``idle_steps``
        steps, and is a lasting straggler (``lasting``: found as slow each time it was
        re-measured, see :meth:`SpeedEstimator.lasting`), while the map is ``settled``
        and more than ``min_servers`` servers are active; else None. A passing straggler
        is left alone: its re-measurement finds it fast and the plans use it again."""
        held = set(owners)
        for s, a in enumerate(active):
            if not a or s in held:
                self._empty_since.pop(s, None)
            elif s not in self._empty_since:
                self._empty_since[s] = clock
        if not settled or sum(active) <= self.min_servers:
            return None
        for s, since in sorted(self._empty_since.items()):
            if s in lasting and clock - since >= self.idle_steps:
                return s
        return None
