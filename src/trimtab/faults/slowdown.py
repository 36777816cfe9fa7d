"""A slow worker, emulated around its training loop: :class:`WorkerSlowdown` is the step
hook a worker calls once per step, after its compute, with how long that compute took.

    slowdown = WorkerSlowdown(parse_stragglers(os.environ.get(ENV, "")), rank)
    ...
    compute_s = slowdown(clock, compute_s)   # sleeps as a slower worker would
    ...
    slowdown.close()

A slowdown of K is the real compute plus a sleep of (K - 1) x its time; ``cpu`` specs
start competing processes for the steps they name (see :mod:`trimtab.faults.stragglers`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from trimtab.faults.stragglers import StragglerSpec, WorkerStraggler


class WorkerSlowdown:
    """The step hook of worker ``rank`` under ``specs`` (those naming other workers or
    servers are ignored). Falsy when no spec names this worker, so a caller can skip
    it. Not thread-safe: the training thread calls it."""

    def __init__(self, specs: Sequence[StragglerSpec], rank: int) -> None:
        self._schedule = WorkerStraggler(specs, rank)

    def __bool__(self) -> bool:
        return bool(self._schedule)

    def __call__(self, clock: int, compute_s: float) -> float:
        """Step ``clock`` computed for ``compute_s`` seconds: start or stop competing
        processes, sleep as much longer as the slowdown says, and return the compute
        time the slowed-down worker would have measured. Blocks for that sleep; never
        raises."""
        self._schedule.on_step(clock)
        factor = self._schedule.factor(clock)
        if factor > 1.0:  # emulated slowness: real compute plus a proportional sleep
            time.sleep((factor - 1.0) * compute_s)
            compute_s *= factor
        return compute_s

    def close(self) -> None:
        """Stop competing processes and give the process its cores back. Idempotent."""
        self._schedule.close()
