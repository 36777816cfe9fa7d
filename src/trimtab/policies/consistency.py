"""Consistency policies: how pushed gradients become updates, and when a worker may go on.

A policy is pure: the server asks it whether a push is in protocol, how much a gradient
counts (a staleness discount, or a drop), when the gradients it holds for a chunk make
an update, and when a worker's reply may be released (SSP holds fast workers back).

- ``bsp``: an update per clock, once every active worker's gradient is in.
- ``asp``: every push is applied on arrival, weighted by its worker's share of the global
  batch (b_i / sum of b_j), so that N pushes move the model as one BSP step; nobody waits.
- ``ssp``: as asp, but a worker that finished clock c gets its reply only once the
  slowest worker has pushed clock c - staleness (Petuum's bounded staleness, by waiting).
- ``saps``: as asp, but a gradient computed from a value ``tau`` versions old counts
  ``free / tau`` when ``tau > free`` and is dropped past ``tau_max`` (the reply then
  refreshes the straggler with the current value): staleness bounded by discounting,
  never by waiting. ``free`` defaults to workers - 1, the staleness that equal-speed
  asynchronous workers produce anyway, so only stragglers are discounted.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Collection, Mapping
from typing import ClassVar

from trimtab.core.registry import Registry
from trimtab.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class PushInfo:
    """What a server knows about one push when it arrives.

    Attributes:
        worker: the pushing worker's rank.
        clock: the worker's clock (iterations it completed before this one).
        weight: the worker's batch size for this step (or 1.0 if not given).
        version_read: the chunk version the gradient was computed from.
        version_now: the chunk's version at the server.
    """

    worker: int
    clock: int
    weight: float
    version_read: int
    version_now: int

    @property
    def staleness(self) -> int:
        return max(0, self.version_now - self.version_read)


class ConsistencyPolicy(abc.ABC):
    """Decides how pushes combine into updates. Pure; no I/O."""

    name: ClassVar[str]
    #: True when one update aggregates every worker's gradient of a clock (BSP): chunks
    #: can then move, and batch sizes change, at a step boundary.
    synchronous: ClassVar[bool] = False
    #: True when the coordinator tells a worker that lags behind the others to refresh
    #: its parameters and skip ahead (SaPS); workers then report every step.
    skips_stragglers: ClassVar[bool] = False

    @classmethod
    def job_args(cls, staleness: int) -> dict[str, int]:
        """The constructor arguments this policy takes from the job's settings, as the
        map carries them to servers and workers (``consistency_args``). Pure."""
        del staleness
        return {}

    def check(self, push: PushInfo, round_: int, last_clock: int | None) -> str | None:
        """Why this push is out of protocol, or ``None`` if it is fine. ``round_`` is the
        chunk's update count, ``last_clock`` the worker's previous push clock."""
        if last_clock is not None and push.clock <= last_clock:
            return f"worker {push.worker} pushed clock {push.clock} after clock {last_clock}"
        return None

    def discount(self, push: PushInfo) -> float | None:
        """The factor (0, 1] this gradient is scaled by, or ``None`` to drop it."""
        return 1.0

    def ready(self, arrived: Collection[int], active: Collection[int]) -> bool:
        """Whether the gradients from ``arrived`` workers make an update now."""
        return True

    def may_release(
        self, clock_after: int, progress: Mapping[int, int], active: Collection[int]
    ) -> bool:
        """Whether a worker whose clock is now ``clock_after`` may get its reply.
        ``progress`` maps each worker to the clocks it has pushed for this chunk."""
        return True


CONSISTENCY: Registry[ConsistencyPolicy] = Registry("consistency")


@CONSISTENCY.register("bsp")
class Bsp(ConsistencyPolicy):
    """Bulk synchronous: a chunk is updated once every active worker's gradient for the
    clock is in; each gradient weighs its worker's batch size (over the global batch)."""

    name = "bsp"
    synchronous = True

    def __init__(self, workers: int = 1) -> None:
        del workers

    def check(self, push: PushInfo, round_: int, last_clock: int | None) -> str | None:
        if push.clock != round_:
            return f"push for clock {push.clock}, but the chunk is at clock {round_}"
        return None

    def ready(self, arrived: Collection[int], active: Collection[int]) -> bool:
        return all(w in arrived for w in active)


@CONSISTENCY.register("asp")
class Asp(ConsistencyPolicy):
    """Asynchronous: every push is applied on arrival; nobody waits."""

    name = "asp"

    def __init__(self, workers: int = 1) -> None:
        del workers


@CONSISTENCY.register("ssp")
class Ssp(ConsistencyPolicy):
    """Stale synchronous: a worker at clock c waits only while the slowest is below
    c - staleness."""

    name = "ssp"

    @classmethod
    def job_args(cls, staleness: int) -> dict[str, int]:
        return {"staleness": staleness}

    def __init__(self, workers: int = 1, staleness: int = 3) -> None:
        del workers
        if staleness < 0:
            raise ConfigError(f"staleness must be >= 0, got {staleness}")
        self.staleness = staleness

    def may_release(
        self, clock_after: int, progress: Mapping[int, int], active: Collection[int]
    ) -> bool:
        slowest = min((progress.get(w, 0) for w in active), default=clock_after)
        return slowest >= clock_after - self.staleness


@CONSISTENCY.register("saps")
class Saps(ConsistencyPolicy):
    """Straggler-aware asynchronous: stale gradients are discounted (``free / tau``) or
    dropped (past ``tau_max``); nobody waits."""

    name = "saps"
    skips_stragglers = True

    def __init__(
        self, workers: int = 1, free: int | None = None, tau_max: int | None = None
    ) -> None:
        self.free = max(1, workers - 1) if free is None else free
        self.tau_max = 4 * max(1, workers) if tau_max is None else tau_max
        if self.free < 1 or self.tau_max < self.free:
            raise ConfigError(f"saps needs 1 <= free <= tau_max, got {self.free}, {self.tau_max}")

    def discount(self, push: PushInfo) -> float | None:
        tau = push.staleness
        if tau > self.tau_max:
            return None
        return 1.0 if tau <= self.free else self.free / tau
