"""Batch-sizing policies: how each step's global batch is split among workers (LB-BSP).

The global batch ``B`` stays fixed; worker ``i`` computes ``b_i`` samples, ``sum b_i = B``,
and each gradient weighs ``b_i`` (:class:`~trimtab.policies.consistency.Bsp`), so the SGD step is
the equal-batch one. A policy maps a snapshot of measurements (:class:`WorkerSample`, one
per worker and step) to sizes, with no I/O, clock or randomness: ``"equal"``, ``"lbbsp"``
(CPU clusters: predicted speeds, equal finish times) and ``"lbbsp-gpu"`` (GPU clusters:
iterative moves under memory caps). Bad measurements raise ``ValueError``; settings that
cannot be met raise :class:`~trimtab.errors.ConfigError`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from trimtab.core.registry import Registry
from trimtab.errors import ConfigError
from trimtab.policies.predictors import (
    PREDICTORS,
    MovingAverage,
    NarxPredictor,
    SpeedPredictor,
    WorkerSample,
)

__all__ = [
    "BATCHING",
    "PREDICTORS",
    "BatchSizingPolicy",
    "EqualBatching",
    "LbBsp",
    "LbBspGpu",
    "MovingAverage",
    "NarxPredictor",
    "SpeedPredictor",
    "WorkerSample",
    "equal_finish_sizes",
    "equal_split",
]


#: Samples every worker needs before LB-BSP measures the workers' noise.
NOISE_SAMPLES = 5


def equal_split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` sizes differing by at most one (larger first)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def equal_finish_sizes(
    speeds: Sequence[float],
    comm_s: Sequence[float],
    global_batch: int,
    *,
    min_batch: int = 1,
    caps: Sequence[int] | None = None,
) -> list[int]:
    """LB-BSP's CPU solution: sizes ``b_i`` with equal finish times ``b_i / v_i + c_i``.

    Unbounded, ``T = (B + sum v_i c_i) / sum v_i`` and ``b_i = v_i (T - c_i)``. A worker
    that would fall below ``min_batch`` or exceed ``caps[i]`` is held there and ``T`` is
    solved over the others (water-filling), so what a bound takes or gives is shared by
    speed. The real sizes are then rounded by largest remainder.

    Returns:
        One integer size per worker (input order), each in ``[min_batch, caps[i]]``,
        summing exactly to ``global_batch``; equal speeds and comm times give
        :func:`equal_split`'s answer.

    Raises:
        ConfigError: if there are no workers, the lengths differ, ``min_batch < 1``,
            ``global_batch < min_batch * n``, a cap is below ``min_batch``,
            ``sum(caps) < global_batch``, a speed is not a finite number > 0, or a comm
            time is not a finite number >= 0.
    """
    n = len(speeds)
    _check_split(n, global_batch, min_batch, caps)
    if len(comm_s) != n:
        raise ConfigError(f"got {n} speeds but {len(comm_s)} comm times")
    v, c = np.asarray(speeds, dtype=float), np.asarray(comm_s, dtype=float)
    if not (np.isfinite(v).all() and (v > 0).all()):
        raise ConfigError(f"every speed must be a finite number > 0, got {list(speeds)}")
    if not (np.isfinite(c).all() and (c >= 0).all()):
        raise ConfigError(f"every comm time must be a finite number >= 0, got {list(comm_s)}")
    lo = np.full(n, min_batch)
    hi = np.asarray(caps) if caps is not None else np.full(n, global_batch)

    def filled(level: float) -> float:
        return float(np.clip(v * (level - c), lo, hi).sum())

    # filled() is continuous, non-decreasing and linear between these breakpoints.
    points = np.unique(np.concatenate([c + lo / v, c + hi / v]))
    first, last = 0, len(points) - 1  # bisect for the first breakpoint that holds enough
    while first < last:
        mid = (first + last) // 2
        first, last = (first, mid) if filled(points[mid]) >= global_batch else (mid + 1, last)
    level = float(points[first])
    if first > 0:
        left = float(points[first - 1])
        below, above = filled(left), filled(level)
        level = left + (level - left) * (global_batch - below) / (above - below)
    real = np.clip(v * (level - c), lo, hi)
    sizes = [int(x) for x in np.clip(np.floor(real), lo, hi)]
    order = sorted(range(n), key=lambda i: (sizes[i] - real[i], i))  # largest remainder first
    missing = global_batch - sum(sizes)
    while missing:  # the sum of the remainders (< n), give or take float error
        sign = 1 if missing > 0 else -1
        for i in order if sign > 0 else order[::-1]:
            if missing and lo[i] <= sizes[i] + sign <= hi[i]:
                sizes[i] += sign
                missing -= sign
    return sizes


class BatchSizingPolicy(abc.ABC):
    """Decides every worker's batch size for the next step. Pure except where a class
    docstring says otherwise; no I/O. Not thread-safe."""

    name: ClassVar[str]
    #: True when the sizes follow each step's measurements: workers then report every
    #: step and wait for the next sizes in the reply, so the job must run ``bsp``.
    adaptive: ClassVar[bool] = True

    @abc.abstractmethod
    def batch_sizes(
        self, history: Mapping[int, Sequence[WorkerSample]], global_batch: int
    ) -> dict[int, int]:
        """Sizes for the next step, by rank, each >= 1, summing to ``global_batch``.

        ``history`` has one entry per worker rank: its samples, oldest first. The lists
        may be empty at the start; then the sizes are equal. Raises
        :class:`ConfigError` if the batch cannot be split as configured, and
        ``ValueError`` if a sample's rank differs from its key.
        """


BATCHING: Registry[BatchSizingPolicy] = Registry("batching")


@BATCHING.register("equal")
class EqualBatching(BatchSizingPolicy):
    """Every worker gets ``B // n`` or ``B // n + 1``, the larger sizes to the lower ranks."""

    name = "equal"
    adaptive = False

    def batch_sizes(
        self, history: Mapping[int, Sequence[WorkerSample]], global_batch: int
    ) -> dict[int, int]:
        ranks = _ranks(history)
        _check_split(len(ranks), global_batch, 1, None)
        return dict(zip(ranks, equal_split(global_batch, len(ranks)), strict=True))


@BATCHING.register("lbbsp")
class LbBsp(BatchSizingPolicy):
    """LB-BSP for CPU clusters, where time is about linear in the batch size.

    Speeds come from ``predictor``, communication times from :func:`_pure_comm`, sizes
    from :func:`equal_finish_sizes`. A rank with no samples yet (just joined) is taken to
    be as fast as the mean of the others; with no samples at all the sizes are equal.

    State (the one exception to purity): the sizes it last decided, which the keeping
    rule (``tolerance``, ``significance``) judges. The workers' samples show them only
    a step later (a size holds from the step after the next); judged by the samples'
    sizes, the rule kept the sizes of two calls ago against the last call's, and the
    split alternated.

    Args:
        predictor: ``"narx"`` or ``"average"`` (:data:`PREDICTORS`), or an instance.
        comm_window: how many recent steps the communication time is taken over.
        min_batch: every worker's least size (>= 1).
        caps: largest size by rank (e.g. what fits in memory); absent ranks are uncapped.
        tolerance: keep the current sizes while their predicted finish times are within
            this fraction of each other, so that noise in the measurements does not
            reshuffle the split every step.
        significance: ...or within this many times the noise of two workers' finish
            times, if more: sqrt(2) times the median, over the workers, of the scatter
            of one step's speed (log space, a standard deviation) over the last
            ``noise_window`` steps. On
            a shared machine a step's speed scatters by more than the 5% of
            ``tolerance``, and the split followed that scatter, a few samples to and
            fro at every step (issue 38).
        noise_window: steps of each worker's speeds the noise is measured over.

    Raises:
        ConfigError: from the constructor for an unknown predictor, ``comm_window < 1``,
            a negative ``tolerance`` or ``significance``, or ``noise_window < 3``.
    """

    name = "lbbsp"

    def __init__(
        self,
        predictor: str | SpeedPredictor = "narx",
        *,
        comm_window: int = 5,
        min_batch: int = 1,
        caps: Mapping[int, int] | None = None,
        tolerance: float = 0.05,
        significance: float = 1.5,
        noise_window: int = 10,
    ) -> None:
        if comm_window < 1:
            raise ConfigError(f"comm_window must be >= 1, got {comm_window}")
        if tolerance < 0 or significance < 0:
            raise ConfigError(
                f"tolerance and significance must be >= 0: {tolerance}, {significance}"
            )
        if noise_window < 3:
            raise ConfigError(f"noise_window must be >= 3, got {noise_window}")
        self.significance, self.noise_window = significance, noise_window
        self._last: dict[int, int] = {}  # the sizes last decided, by rank
        self.predictor = PREDICTORS.create(predictor) if isinstance(predictor, str) else predictor
        self.comm_window, self.min_batch, self.caps = comm_window, min_batch, dict(caps or {})
        self.tolerance = tolerance

    def batch_sizes(
        self, history: Mapping[int, Sequence[WorkerSample]], global_batch: int
    ) -> dict[int, int]:
        ranks = _ranks(history)
        caps = [self.caps.get(r, global_batch) for r in ranks] if self.caps else None
        known = [r for r in ranks if history[r]]
        speed = dict(
            zip(known, self.predictor.predict_many([history[r] for r in known]), strict=True)
        )
        comm = _pure_comm(history, self.comm_window)
        mean_speed = sum(speed.values()) / len(known) if known else 1.0
        mean_comm = sum(comm.values()) / len(known) if known else 0.0
        if len(known) == len(ranks) and ranks:
            # The sizes last decided, which the workers' reports may not show yet
            # (they hold a step later); the last reported where the ranks changed.
            last = self._last if set(self._last) == set(ranks) else {}
            current = [last.get(r, history[r][-1].batch) for r in ranks]
            finish = [
                b / speed[r] + comm.get(r, mean_comm) for r, b in zip(ranks, current, strict=True)
            ]
            # Two workers' finish times differ by the noise of both: sqrt(2) of one's.
            noise = math.sqrt(2) * self._noise(history, ranks)
            limit = max(self.tolerance, self.significance * noise)
            if sum(current) == global_batch and (max(finish) - min(finish) <= limit * max(finish)):
                self._last = dict(zip(ranks, current, strict=True))
                return dict(self._last)
        sizes = equal_finish_sizes(
            [speed.get(r, mean_speed) for r in ranks],
            [comm.get(r, mean_comm) for r in ranks],
            global_batch,
            min_batch=self.min_batch,
            caps=caps,
        )
        self._last = dict(zip(ranks, sizes, strict=True))
        return dict(self._last)

    def _noise(self, history: Mapping[int, Sequence[WorkerSample]], ranks: list[int]) -> float:
        """The median over ``ranks`` of the scatter of their last ``noise_window``
        speeds (1.4826 times the median distance of the logs from their median); 0 while
        a rank has fewer than :data:`NOISE_SAMPLES`."""
        n = min(self.noise_window, min(len(history[r]) for r in ranks))
        if n < NOISE_SAMPLES or self.significance == 0:
            return 0.0
        logs = np.log(np.array([[s.speed for s in history[r][-n:]] for r in ranks]))
        spread = np.median(np.abs(logs - np.median(logs, axis=1, keepdims=True)), axis=1)
        return float(1.4826 * np.median(spread))


@BATCHING.register("lbbsp-gpu")
class LbBspGpu(BatchSizingPolicy):
    """LB-BSP for GPU clusters: speed is non-linear in the batch size, memory caps it.

    Each call takes every worker's last size ``b_i`` and step time ``t_i`` (its last
    ``compute_s`` plus :func:`_pure_comm`; the raw ``comm_s`` would make all ``t_i`` equal
    in BSP). With ``T = mean(t_i)``, a worker more than ``tolerance * T`` off wants
    ``b_i + step_i * b_i * (T - t_i) / t_i``. These moves need not sum to zero, so the
    wanted sizes are scaled to sum to ``B`` (keeping their proportions; a worker pushed
    past ``min_batch`` or ``caps[i]`` is held there and the rest rescaled) and rounded by
    largest remainder, as in :func:`equal_finish_sizes`.

    State (the one exception to purity): per rank, ``step_i`` (starting at 1.0) and the
    direction of its last move. A move against the previous direction halves ``step_i``
    (not below 1/16), so the sizes converge; a move in the same direction multiplies it
    by ``growth`` (up to 1.0), so a worker whose speed drifts later is not stuck with a
    tiny step (``growth=1.0`` is the paper's rule). A rank's state goes when it leaves
    ``history``; all of it is reset, and the sizes are equal, when a rank has no samples.

    Raises:
        ConfigError: from the constructor if ``comm_window < 1``, ``tolerance < 0`` or
            ``growth`` is not in ``[1, 2)``.
    """

    name = "lbbsp-gpu"

    def __init__(
        self,
        *,
        min_batch: int = 1,
        caps: Mapping[int, int] | None = None,
        comm_window: int = 5,
        tolerance: float = 0.01,
        growth: float = 1.2,
    ) -> None:
        if comm_window < 1 or not tolerance >= 0:
            raise ConfigError(f"need comm_window >= 1, tolerance >= 0: {comm_window}, {tolerance}")
        if not 1.0 <= growth < 2.0:
            raise ConfigError(f"growth must be in [1, 2) so that halving wins, got {growth}")
        self.min_batch, self.caps = min_batch, dict(caps or {})
        self.comm_window, self.tolerance, self.growth = comm_window, tolerance, growth
        self._step: dict[int, float] = {}
        self._direction: dict[int, int] = {}

    def batch_sizes(
        self, history: Mapping[int, Sequence[WorkerSample]], global_batch: int
    ) -> dict[int, int]:
        ranks = _ranks(history)
        n = len(ranks)
        caps = [self.caps.get(r, global_batch) for r in ranks]
        _check_split(n, global_batch, self.min_batch, caps)  # before the state changes
        if not all(history[r] for r in ranks):
            self._step.clear()
            self._direction.clear()
            sizes = equal_finish_sizes(
                [1.0] * n, [0.0] * n, global_batch, min_batch=self.min_batch, caps=caps
            )
            return dict(zip(ranks, sizes, strict=True))
        for r in set(self._step) - set(ranks):
            del self._step[r], self._direction[r]
        comm = _pure_comm(history, self.comm_window)
        times = [history[r][-1].compute_s + comm[r] for r in ranks]
        target = sum(times) / n
        wanted = []
        for r, t in zip(ranks, times, strict=True):
            batch = float(history[r][-1].batch)
            if abs(target - t) > self.tolerance * target:
                direction = 1 if target > t else -1
                step = self._step.get(r, 1.0)
                if self._direction.get(r, direction) != direction:
                    step = max(step / 2, 1 / 16)
                else:
                    step = min(1.0, step * self.growth)
                self._step[r], self._direction[r] = step, direction
                batch *= 1 + step * (target - t) / t
            wanted.append(batch)
        sizes = equal_finish_sizes(
            wanted, [0.0] * n, global_batch, min_batch=self.min_batch, caps=caps
        )
        return dict(zip(ranks, sizes, strict=True))


def _ranks(history: Mapping[int, Sequence[WorkerSample]]) -> list[int]:
    """The ranks in ``history``, sorted. Raises ``ValueError`` for a sample under another
    rank's key."""
    for rank, samples in history.items():
        if any(s.rank != rank for s in samples):
            raise ValueError(f"history[{rank}] holds a sample of another rank")
    return sorted(history)


def _pure_comm(history: Mapping[int, Sequence[WorkerSample]], window: int) -> dict[int, float]:
    """Each rank's communication time without waiting for slower workers (ranks with no
    samples are left out), the least over the last ``window`` steps.

    In BSP ``comm_s`` includes waiting for the slowest worker. Solving with it keeps a
    worker that is always faster exactly as slow-paced as it was: equal sizes solve
    ``b/v_fast + c + wait = b/v_slow + c``. So a step's wait is estimated as its longest
    ``compute_s`` minus the worker's own. Histories are aligned at their ends.
    """
    comm: dict[int, float] = {}
    for back in range(1, window + 1):
        step = {r: h[-back] for r, h in history.items() if len(h) >= back}
        longest = max((s.compute_s for s in step.values()), default=0.0)
        for r, s in step.items():
            rest = max(0.0, s.comm_s - (longest - s.compute_s))
            comm[r] = min(comm.get(r, rest), rest)
    return comm


def _check_split(n: int, total: int, min_batch: int, caps: Sequence[int] | None) -> None:
    """Raises :class:`ConfigError` unless ``total`` splits into ``n`` sizes in
    ``[min_batch, caps[i]]``."""
    if n < 1:
        raise ConfigError("there are no workers to split the global batch among")
    if min_batch < 1:
        raise ConfigError("min_batch must be >= 1 (else a worker is never measured again)")
    if total < min_batch * n:
        raise ConfigError(
            f"global_batch {total} cannot give each of {n} workers min_batch={min_batch}; "
            "raise global_batch or lower min_batch"
        )
    if caps is not None and (len(caps) != n or min(caps) < min_batch or sum(caps) < total):
        raise ConfigError(
            f"caps {list(caps)} must be one per worker ({n}), each >= min_batch={min_batch}, "
            f"summing to >= global_batch {total}; raise the caps or lower global_batch"
        )
