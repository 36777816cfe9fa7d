"""The policies a simulated job runs: the runtime's own objects, built from the same
registries and settings as the coordinator builds them, each call timed on the wall
clock.

Nothing here decides anything: :class:`Policies` holds the objects
(:data:`~trimtab.policies.placement.PLACEMENTS`,
:data:`~trimtab.policies.consistency.CONSISTENCY`,
:data:`~trimtab.policies.batching.BATCHING`,
:class:`~trimtab.policies.psld.PsldController` and
:class:`~trimtab.policies.psld.SpeedEstimator`,
:data:`~trimtab.policies.detection.DETECTORS`,
:data:`~trimtab.policies.scaling.SCALING`) and :meth:`Policies.call` runs one of their
methods and records how long it took. A test (``tests/unit/test_sim_policies.py``)
fails if a module of this package defines a policy of its own.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trimtab.policies.batching import BATCHING, BatchSizingPolicy
from trimtab.policies.consistency import CONSISTENCY, ConsistencyPolicy
from trimtab.policies.detection import DEFAULT_DETECTOR, DETECTORS, StragglerDetector
from trimtab.policies.placement import PLACEMENTS, PlacementPolicy
from trimtab.policies.psld import PsldController, SpeedEstimator
from trimtab.policies.scaling import DEFAULT_SCALING, SCALING, ScalingPolicy
from trimtab.settings import JobSettings

__all__ = ["DecisionTimes", "Policies"]

_R = TypeVar("_R")


@dataclasses.dataclass
class DecisionTimes:
    """Wall-clock seconds of each policy call, by name (``"psld.decide"``...).

    Not thread-safe. Never blocks.
    """

    calls: dict[str, int] = dataclasses.field(default_factory=dict)
    total_s: dict[str, float] = dataclasses.field(default_factory=dict)
    max_s: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        """Count one call of ``name`` that took ``seconds``."""
        self.calls[name] = self.calls.get(name, 0) + 1
        self.total_s[name] = self.total_s.get(name, 0.0) + seconds
        self.max_s[name] = max(self.max_s.get(name, 0.0), seconds)

    @property
    def slowest_ms(self) -> float:
        """The slowest call's milliseconds (0 before any)."""
        return 1e3 * max(self.max_s.values(), default=0.0)

    @property
    def slowest_name(self) -> str | None:
        """The name of the slowest call (None before any)."""
        return max(self.max_s, key=self.max_s.__getitem__, default=None)

    def to_dict(self) -> dict[str, dict[str, float]]:
        """Per call name: calls, mean_ms, max_ms (rounded). Pure."""
        return {
            name: {
                "calls": self.calls[name],
                "mean_ms": round(1e3 * self.total_s[name] / self.calls[name], 3),
                "max_ms": round(1e3 * self.max_s[name], 3),
            }
            for name in sorted(self.calls)
        }


class Policies:
    """A job's policy objects, as the coordinator makes them from ``job``.

    Raises :class:`~trimtab.errors.ConfigError` from the constructor for a name no
    registry has (the settings refuse it first). Not thread-safe.

    Attributes:
        placement, consistency, batching, detector, scaling: the registries' objects
            (``consistency`` the coordinator's, ``server_consistency`` the servers').
        psld: the live placement's controller (None unless ``placement.live``).
        speeds: the servers' speed figures PSLD and scaling read.
        times: every call's wall-clock time.
    """

    def __init__(self, job: JobSettings) -> None:
        # As Coordinator.__init__ builds them (roles/coordinator/node.py).
        self.placement: PlacementPolicy = PLACEMENTS.create(job.placement.policy)
        self.consistency: ConsistencyPolicy = CONSISTENCY.create(
            job.consistency.mode, workers=job.workers
        )
        # The servers' own, from what the map carries (ServerStore.learn_job): with the
        # job's arguments (ssp's staleness), which the coordinator's lacks.
        self.server_consistency: ConsistencyPolicy = CONSISTENCY.create(
            job.consistency.mode,
            workers=job.workers,
            **self.consistency.job_args(job.consistency.staleness),
        )
        self.batching: BatchSizingPolicy = BATCHING.create(job.batching.policy)
        self.psld: PsldController | None = (
            PsldController(min_servers=job.servers) if self.placement.live else None
        )
        self.detector: StragglerDetector = DETECTORS.create(DEFAULT_DETECTOR)
        self.speeds = SpeedEstimator()
        self.scaling: ScalingPolicy = SCALING.create(
            DEFAULT_SCALING,
            idle_steps=self.psld.window if self.psld else 0,
            min_servers=job.servers,
        )
        self.times = DecisionTimes()

    def call(self, name: str, method: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
        """``method(*args, **kwargs)``, timed under ``name``; returns what it returns
        and raises what it raises (the time is counted either way). The garbage
        collector is held off during the call: a full collection of the simulator's
        heap (a thousand workers' histories and more) is the simulator's cost, not the
        policy's, and took one call of 15 ms to over 100 ms now and then."""
        collecting = gc.isenabled()
        gc.disable()
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            self.times.add(name, time.perf_counter() - start)
            if collecting:
                gc.enable()
