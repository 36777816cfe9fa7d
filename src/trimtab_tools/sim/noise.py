"""The measurement noise of PSLD's speed figures, recorded on a real run and drawn again
in a simulated one.

PSLD plans with two kinds of figure per server: the servers' busy windows (bytes per
busy second between two load reports, the ``load`` events of a run record) and the
workers' per-step bounds (a step's bytes over its longest span from a first push and
over its shortest span from a wait, the ``traffic`` events). On a shared machine they
scatter from step to step by more than the step times do (10 to 20% against 5 to 7%
on the test bed): the scheduler, TCP and the reading of replies only while a worker
waits all add to them, and none of that is in the simulator's model. What a plan must
beat is that scatter (``SpeedEstimator.errors``), so a simulator whose figures scatter
less moves chunks earlier than the runtime.

:func:`recorded` takes the noise from a run record: each figure's log deviation from
its server's running median (over :data:`WINDOW` figures, centred: a level the server
holds for a while is not noise). :func:`thinned` keeps what the simulated figures'
own scatter leaves unexplained (their variances add), and :class:`Draws` draws it
again: the workers' bounds as the record has them, every server's deviations of one
step together and the steps in their order (``RecordedNoise.series``, from a random
step on), the busy windows by resampling (the bounds' two as a pair: they come from
the same spans). Why in order: the bed's figures move together (a third to a half of
their variance is common to the servers of a step) and over several steps; drawn
server by server and step by step, the simulated PSLD made one to two and a half
times as many moves after its first as the bed's in the first 20 steps, and the same
decisions in 5 of 30 seeded runs of three sittings; replayed in order, in 13 of 30
(issue 38, eighth round). Outputs without a series draw every pair independently, as
before. Pure but for :class:`Draws`' seeded random stream.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "MIN_BUSY_S",
    "WINDOW",
    "Draws",
    "RecordedNoise",
    "WindowRecord",
    "deviations",
    "meter_push_s",
    "recorded",
    "scatter",
    "thinned",
]

#: Figures of one server over which a running median is its level.
WINDOW = 16
#: A busy window shorter than this is not a figure (``SpeedEstimator``'s ``min_busy_s``).
MIN_BUSY_S = 0.005
#: A server needs this many figures before its deviations count.
MIN_FIGURES = 4


def deviations(values: Sequence[float], window: int = WINDOW) -> list[float]:
    """Each of ``values``' (positive figures of one server, in time order) log deviation
    from the median of the ``window`` figures centred on it. Pure; raises ValueError for
    a figure that is not > 0."""
    logs = [math.log(v) for v in values]
    half = window // 2
    out = []
    for i, x in enumerate(logs):
        around = logs[max(0, i - half) : i - half + window]
        out.append(x - statistics.median(around))
    return out


def scatter(values: Iterable[float]) -> float:
    """The robust standard deviation of deviations (1.4826 times their median absolute
    value, as ``SpeedEstimator`` pools the bounds' scatter); 0 for none. Pure."""
    absolute = [abs(v) for v in values]
    return 1.4826 * statistics.median(absolute) if absolute else 0.0


@dataclasses.dataclass(frozen=True)
class RecordedNoise:
    """Log deviations to draw from: ``bounds`` the workers' (lower, upper) pairs,
    ``windows`` the busy windows'. Either may be empty (nothing to draw). ``series``:
    the bounds' pairs step by step in the record's order, one per server that has a
    figure at every one of those steps (empty where not known: outputs before
    2026-11-29's eighth round, or figures given without their steps)."""

    bounds: tuple[tuple[float, float], ...] = ()
    windows: tuple[float, ...] = ()
    series: tuple[tuple[tuple[float, float], ...], ...] = ()

    def scatters(self) -> dict[str, float]:
        """The scatter (:func:`scatter`) of the lower bounds, the upper bounds and the
        windows."""
        return {
            "lower": round(scatter(b[0] for b in self.bounds), 4),
            "upper": round(scatter(b[1] for b in self.bounds), 4),
            "windows": round(scatter(self.windows), 4),
        }

    def to_json(self) -> dict[str, Any]:
        """As JSON values (:meth:`from_json` reads them back)."""
        return {
            "bounds": [[round(a, 5), round(b, 5)] for a, b in self.bounds],
            "windows": [round(w, 5) for w in self.windows],
            "series": [[[round(a, 5), round(b, 5)] for a, b in step] for step in self.series],
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> RecordedNoise:
        """From :meth:`to_json`'s values. Raises KeyError, TypeError or ValueError for
        malformed ones."""
        bounds = tuple((float(a), float(b)) for a, b in value["bounds"])
        series = tuple(
            tuple((float(a), float(b)) for a, b in step) for step in value.get("series", ())
        )
        if len({len(step) for step in series}) > 1:
            raise ValueError("series: every step needs the same servers")
        return cls(bounds, tuple(float(w) for w in value["windows"]), series)


def _per_server(figures: Mapping[int, Sequence[float]]) -> list[list[float]]:
    return [deviations(v) for v in figures.values() if len(v) >= MIN_FIGURES]


def from_figures(
    bounds: Mapping[int, Sequence[tuple[float, float]]],
    windows: Mapping[int, Sequence[float]],
    clocks: Mapping[int, Sequence[int]] | None = None,
) -> RecordedNoise:
    """The deviations of per-server figures: ``bounds`` each server's (lower, upper)
    speed bounds step by step, ``windows`` its busy windows' speeds (bytes/s, > 0);
    ``clocks``, where given, the step of each of a server's bounds (then ``series``
    holds the steps every such server has a figure at, in order). A server with fewer
    than :data:`MIN_FIGURES` of a kind gives none of it. Pure."""
    pairs: list[tuple[float, float]] = []
    by_server: dict[int, dict[int, tuple[float, float]]] = {}
    for server, b in bounds.items():
        if len(b) >= MIN_FIGURES:
            low, high = deviations([x[0] for x in b]), deviations([x[1] for x in b])
            mine = list(zip(low, high, strict=True))
            pairs.extend(mine)
            if clocks is not None:
                by_server[server] = dict(zip(clocks[server], mine, strict=True))
    series: tuple[tuple[tuple[float, float], ...], ...] = ()
    if len(by_server) >= 2:
        steps = sorted(set.intersection(*(set(d) for d in by_server.values())))
        series = tuple(tuple(by_server[s][k] for s in sorted(by_server)) for k in steps)
    windowed = tuple(x for d in _per_server(windows) for x in d)
    return RecordedNoise(tuple(pairs), windowed, series)


def recorded(events: Iterable[Mapping[str, Any]]) -> RecordedNoise:
    """The noise of a run record's events (``events.jsonl``'s, in order): the
    ``traffic`` events' bounds (bytes over span, over wait span; rows with a span or
    wait not > 0 left out) and the ``load`` events' busy windows (successive reports of
    a server, at least :data:`MIN_BUSY_S` busy seconds and some bytes apart). Pure."""
    bounds: dict[int, list[tuple[float, float]]] = {}
    clocks: dict[int, list[int]] = {}
    windows: dict[int, list[float]] = {}
    last: dict[int, tuple[float, float]] = {}
    for e in events:
        kind = e.get("kind")
        if kind == "traffic":
            for server, span, wait, nbytes in e.get("servers", []):
                if span > 0 and wait > 0 and nbytes > 0:
                    bounds.setdefault(int(server), []).append((nbytes / span, nbytes / wait))
                    clocks.setdefault(int(server), []).append(int(e.get("clock", -1)))
        elif kind == "load":
            server, busy, nbytes = int(e["server"]), float(e["busy_s"]), float(e["bytes"])
            before = last.get(server)
            if before is None or busy < before[0]:
                last[server] = (busy, nbytes)
                continue
            dbusy, dbytes = busy - before[0], nbytes - before[1]
            if dbusy >= MIN_BUSY_S and dbytes > 0:
                windows.setdefault(server, []).append(dbytes / dbusy)
                last[server] = (busy, nbytes)
    return from_figures(bounds, windows, clocks)


def thinned(noise: RecordedNoise, simulated: Mapping[str, float]) -> RecordedNoise:
    """``noise`` less what a simulation's own figures already scatter (``simulated``,
    as :meth:`RecordedNoise.scatters` gives them): each kind's deviations scaled by
    sqrt(1 - (simulated / recorded)^2), none where the simulation scatters as much or
    more, so that the simulated figures plus the draws scatter as the recorded ones
    (independent noises' variances add). Pure."""
    have = noise.scatters()

    def factor(kind: str) -> float:
        rec, sim = have[kind], simulated.get(kind, 0.0)
        return math.sqrt(max(0.0, 1.0 - (sim / rec) ** 2)) if rec > 0 else 0.0

    lo, up, win = factor("lower"), factor("upper"), factor("windows")
    return RecordedNoise(
        tuple((a * lo, b * up) for a, b in noise.bounds),
        tuple(w * win for w in noise.windows),
        tuple(tuple((a * lo, b * up) for a, b in step) for step in noise.series),
    )


class Draws:
    """Deviations drawn from a :class:`RecordedNoise`, ``count`` servers a step, the
    same for a step however often it is asked (steps asked out of order draw the ones
    between). Where the noise has a ``series``, step ``k``'s bounds are its step
    ``start + k`` (around its end), each server following one recorded server's
    (``start`` and the servers' shuffle drawn once); else each server's pair is drawn
    from every pair. Seeded: runs repeat. Not thread-safe; never blocks."""

    def __init__(self, noise: RecordedNoise, seed: int, count: int) -> None:
        self._bounds = np.array(noise.bounds, dtype=float).reshape(-1, 2)
        self._windows = np.array(noise.windows, dtype=float)
        self._rng = np.random.default_rng(seed)
        self.count = count
        self._steps: list[tuple[np.ndarray, np.ndarray]] = []
        self._series = np.array(noise.series, dtype=float)
        if self._series.size:
            recorded_servers = self._series.shape[1]
            self._start = int(self._rng.integers(0, len(self._series)))
            shuffled = self._rng.permutation(max(count, recorded_servers)) % recorded_servers
            self._which = shuffled[:count]

    @property
    def empty(self) -> bool:
        """Whether there is nothing to draw (every factor 1)."""
        return not (self._bounds.size or self._windows.size)

    def at(self, clock: int) -> tuple[np.ndarray, np.ndarray]:
        """Step ``clock``'s factors per server: ``(count, 2)`` for the lower and upper
        bounds, ``(count,)`` for the busy windows (exp of the deviations drawn; 1 where
        nothing was recorded)."""
        while len(self._steps) <= clock:
            bounds = np.zeros((self.count, 2))
            windows = np.zeros(self.count)
            if self._series.size:
                row = self._series[(self._start + len(self._steps)) % len(self._series)]
                bounds = row[self._which]
            elif self._bounds.size:
                bounds = self._bounds[self._rng.integers(0, len(self._bounds), self.count)]
            if self._windows.size:
                windows = self._windows[self._rng.integers(0, self._windows.size, self.count)]
            self._steps.append((np.exp(bounds), np.exp(windows)))
        return self._steps[clock]


class WindowRecord:
    """Keeps each simulated server's busy windows as ``SpeedEstimator.observe`` takes
    them (at least :data:`MIN_BUSY_S` busy seconds and some bytes since the last one)
    in ``windows`` (a trace's: :func:`from_figures` reads them). Not thread-safe."""

    def __init__(self, windows: dict[int, list[float]]) -> None:
        self.windows = windows
        self._last: dict[int, tuple[float, float]] = {}

    def take(self, server: int, busy_s: float, nbytes: float) -> None:
        """Server ``server``'s cumulative counters at a report. Never blocks."""
        last = self._last.get(server, (0.0, 0.0))
        busy, moved = busy_s - last[0], nbytes - last[1]
        if busy >= MIN_BUSY_S and moved > 0:
            self.windows.setdefault(server, []).append(moved / busy)
            self._last[server] = (busy_s, nbytes)


def meter_push_s(events: Iterable[Mapping[str, Any]]) -> float | None:
    """The busy seconds a server's load meter counted per request (a push and its
    reply) in a run record's ``load`` events: per server, from its first report with
    a request to its last; the median over the servers. None without two such reports
    of any server. Pure."""
    spans: dict[int, list[tuple[float, int]]] = {}
    for e in events:
        if e.get("kind") == "load" and int(e.get("requests", 0)) > 0:
            seen = spans.setdefault(int(e["server"]), [])
            seen.append((float(e["busy_s"]), int(e["requests"])))
    each = [
        (b[-1][0] - b[0][0]) / (b[-1][1] - b[0][1])
        for b in spans.values()
        if len(b) >= 2 and b[-1][1] > b[0][1]
    ]
    return statistics.median(each) if each else None
