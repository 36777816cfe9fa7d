"""Worker speeds for batch sizing: one worker's measurement of a step
(:class:`WorkerSample`) and the predictors of its next speed (LB-BSP's NARX-style
predictor, a moving average), picked by name from :data:`PREDICTORS`.

Pure: no I/O, clock or randomness. :mod:`trimtab.policies.batching` sizes the batches
from what these predict (and re-exports these names).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from trimtab.core.registry import Registry
from trimtab.errors import ConfigError

__all__ = ["PREDICTORS", "MovingAverage", "NarxPredictor", "SpeedPredictor", "WorkerSample"]


@dataclasses.dataclass(frozen=True)
class WorkerSample:
    """One worker's measurement of one step.

    Attributes:
        rank: the worker's rank.
        batch: samples this worker computed in the step (>= 1).
        compute_s: forward+backward (+ data) seconds for those samples (> 0).
        comm_s: seconds the worker spent waiting for the servers in that step (>= 0).
            In BSP this includes waiting for slower workers.
        cpu_share: process CPU time / wall time during compute (1.0 = had a full core;
            lower = interference). The predictor uses it as its exogenous input.

    Raises:
        ValueError: from the constructor if a field is out of range or not finite.
    """

    rank: int
    batch: int
    compute_s: float
    comm_s: float
    cpu_share: float

    def __post_init__(self) -> None:
        times = (self.compute_s, self.comm_s, self.cpu_share)
        if not (self.rank >= 0 and self.batch >= 1 and self.compute_s > 0 and min(times) >= 0):
            raise ValueError(f"{self}: need rank >= 0, batch >= 1, compute_s > 0, others >= 0")
        if not all(map(math.isfinite, times)):
            raise ValueError(f"{self}: times and cpu_share must be finite")

    @property
    def speed(self) -> float:
        """Samples per second of compute in this step (always > 0)."""
        return self.batch / self.compute_s


class SpeedPredictor(abc.ABC):
    """Predicts a worker's compute speed for the next step. Pure; no I/O."""

    name: ClassVar[str]

    @abc.abstractmethod
    def predict(self, history: Sequence[WorkerSample]) -> float:
        """Predicted samples/s (> 0) for the next step from one worker's recent samples
        (oldest first). Raises ``ValueError`` on an empty history."""

    def predict_many(self, histories: Sequence[Sequence[WorkerSample]]) -> list[float]:
        """:meth:`predict` of each history, in order; a predictor may do them together
        (faster for a thousand workers). Raises ``ValueError`` if one is empty."""
        return [self.predict(h) for h in histories]


PREDICTORS: Registry[SpeedPredictor] = Registry("speed predictor")


@PREDICTORS.register("average")
class MovingAverage(SpeedPredictor):
    """The mean of ``batch / compute_s`` over the last ``window`` samples.

    Raises:
        ConfigError: from the constructor if ``window < 1``.
    """

    name = "average"

    def __init__(self, window: int = 5) -> None:
        if window < 1:
            raise ConfigError(f"MovingAverage window must be >= 1, got {window}")
        self.window = window

    def predict(self, history: Sequence[WorkerSample]) -> float:
        if not history:
            raise ValueError("cannot predict a speed from an empty history")
        recent = history[-self.window :]
        return sum(s.speed for s in recent) / len(recent)


@PREDICTORS.register("narx")
class NarxPredictor(SpeedPredictor):
    """An autoregressive model with exogenous input, in the spirit of LB-BSP's NARX.

    ``v[t+1] = a0 + sum_{k<p} a_k v[t-k] + sum_{k<q} b_k cpu_share[t-k]``, refitted on
    every call by ridge-regularised least squares over the last ``window`` samples. The
    fit is of the change ``v[t+1] - v[t]`` on standardised features, so the penalty
    (``ridge`` times the row count) pulls towards "no change" whatever the speed's scale,
    and a short, noisy window does not make it predict swings that are not there.

    The fit starts from the speeds' level, not their last value: the lagged speeds, and
    the speed a step's change is counted from, go through a running median of
    ``despike`` steps (1: raw), and the change fitted is the next raw speed's from that
    level. One odd step, a pause or another process's burst on a shared machine, is
    then no level to start from, while the CPU share (raw) still announces what it
    announces.

    With fewer than ``p + q + 3`` samples it returns :class:`MovingAverage`'s answer. A
    prediction is clamped to ``[0.25, 4]`` times the last observed speed, so a bad fit
    never yields a non-positive or absurd speed, and to the speeds of its window (the
    slowest and the fastest seen): beyond them a fit of a few noisy rows extrapolates
    noise. On the test bed a fast worker's one slow step made the fit predict it a
    third faster than it had ever run: its batch went from 39 to 64 and back at the
    next step (issue 38).

    Raises:
        ConfigError: from the constructor if ``p < 1``, ``q < 0``, ``ridge < 0``,
            ``window < p + q + 3`` or ``despike < 1``.
    """

    name = "narx"

    def __init__(
        self, p: int = 2, q: int = 2, window: int = 20, ridge: float = 0.1, despike: int = 3
    ) -> None:
        if despike < 1:
            raise ConfigError(f"NarxPredictor despike must be >= 1, got {despike}")
        self.despike = despike
        if p < 1 or q < 0:
            raise ConfigError(f"NarxPredictor needs p >= 1 and q >= 0, got p={p}, q={q}")
        if not (math.isfinite(ridge) and ridge >= 0):
            raise ConfigError(f"NarxPredictor ridge must be a finite number >= 0, got {ridge}")
        if window < p + q + 3:
            raise ConfigError(f"NarxPredictor window must be >= p + q + 3 = {p + q + 3}")
        self.p, self.q, self.window, self.ridge = p, q, window, ridge
        self._fallback = MovingAverage()

    def predict(self, history: Sequence[WorkerSample]) -> float:
        if not history:
            raise ValueError("cannot predict a speed from an empty history")
        recent = history[-self.window :]
        if len(recent) < self.p + self.q + 3:
            return self._fallback.predict(recent)
        raw = np.array([s.speed for s in recent])
        v = self._filtered(raw)
        u = np.array([s.cpu_share for s in recent])
        first = max(self.p, self.q) - 1  # the first step with all lags available
        x = np.array([self._features(v, u, t) for t in range(first, len(v) - 1)])
        y = raw[first + 1 :] - v[first:-1]
        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale[scale == 0] = 1.0  # a constant column centres to zero and gets no weight
        z = (x - mean) / scale
        penalty = math.sqrt(self.ridge * len(y)) * np.eye(z.shape[1])
        weights = np.linalg.lstsq(
            np.vstack([z, penalty]), np.concatenate([y - y.mean(), np.zeros(z.shape[1])]), None
        )[0]
        now = (self._features(v, u, len(v) - 1) - mean) / scale
        last = float(v[-1])
        guess = last + float(y.mean() + now @ weights)
        if not math.isfinite(guess):
            return self._fallback.predict(recent)
        guess = min(max(guess, float(raw.min())), float(raw.max()))
        return min(max(guess, 0.25 * last), 4.0 * last)

    def predict_many(self, histories: Sequence[Sequence[WorkerSample]]) -> list[float]:
        """:meth:`predict` of each history, the fits of histories of one length solved
        together (one batched solve of the ridge problem's normal equations instead of
        one least-squares fit per worker: 115 ms -> a few ms for 1,000 workers). The
        same answers, to float rounding. With ``ridge == 0`` (a fit that may be
        singular) each is fitted alone."""
        out: list[float | None] = [None] * len(histories)
        by_length: dict[int, list[int]] = {}
        for i, h in enumerate(histories):
            n = min(len(h), self.window)
            if self.ridge > 0 and n >= self.p + self.q + 3:
                by_length.setdefault(n, []).append(i)
            else:
                out[i] = self.predict(h)
        for n, members in by_length.items():
            for i, guess in zip(members, self._fit_together(histories, members, n), strict=True):
                out[i] = guess if guess is not None else self.predict(histories[i])
        return [x for x in out if x is not None]

    def _fit_together(
        self, histories: Sequence[Sequence[WorkerSample]], members: list[int], n: int
    ) -> list[float | None]:
        """The predictions of ``histories[members]`` (each with ``n`` recent samples
        used); None where the fit is not finite (the caller falls back)."""
        recent = [histories[i][-n:] for i in members]
        raw = np.array([[s.speed for s in h] for h in recent])
        v = self._filtered(raw)
        u = np.array([[s.cpu_share for s in h] for h in recent])
        first = max(self.p, self.q) - 1
        rows = n - 1 - first
        columns = [v[:, first - k : n - 1 - k] for k in range(self.p)]
        columns += [u[:, first - k : n - 1 - k] for k in range(self.q)]
        x = np.stack(columns, axis=2)  # (workers, rows, features)
        y = raw[:, first + 1 :] - v[:, first:-1]
        mean, scale = x.mean(axis=1, keepdims=True), x.std(axis=1, keepdims=True)
        scale[scale == 0] = 1.0
        z = (x - mean) / scale
        gram = np.einsum("wrf,wrg->wfg", z, z) + self.ridge * rows * np.eye(z.shape[2])
        rhs = np.einsum("wrf,wr->wf", z, y - y.mean(axis=1, keepdims=True))
        weights = np.linalg.solve(gram, rhs[:, :, None])[:, :, 0]
        now = [v[:, n - 1 - k] for k in range(self.p)] + [u[:, n - 1 - k] for k in range(self.q)]
        now_z = (np.stack(now, axis=1) - mean[:, 0, :]) / scale[:, 0, :]
        last = v[:, -1]
        guesses = last + y.mean(axis=1) + np.einsum("wf,wf->w", now_z, weights)
        guesses = np.clip(guesses, raw.min(axis=1), raw.max(axis=1))
        return [
            min(max(float(g), 0.25 * float(b)), 4.0 * float(b)) if math.isfinite(g) else None
            for g, b in zip(guesses, last, strict=True)
        ]

    def _filtered(self, v: np.ndarray) -> np.ndarray:
        """``v`` (speeds along the last axis) through the running median of
        :attr:`despike` steps, the first steps over those there are."""
        k = self.despike
        if k <= 1 or v.shape[-1] < 2:
            return v
        pad = np.repeat(v[..., :1], k - 1, axis=-1)  # the first speed stands for before
        windows = np.lib.stride_tricks.sliding_window_view(
            np.concatenate([pad, v], axis=-1), k, axis=-1
        )
        out: np.ndarray = np.median(windows, axis=-1)
        return out

    def _features(self, v: np.ndarray, u: np.ndarray, t: int) -> np.ndarray:
        return np.concatenate([v[t - self.p + 1 : t + 1][::-1], u[t - self.q + 1 : t + 1][::-1]])
