"""PSLD's speed figures: each server's bytes per busy second, from what the servers report
and corrected by what the workers observe (pure; every input is an argument)."""

from __future__ import annotations

import collections
import math
import statistics

from trimtab.policies.psld.change import ChangeSettings, LevelTracker

#: A server re-measured after its figure was dropped for idleness is "as slow as before"
#: while its new figure stays below this many times the dropped one. A recovered
#: straggler comes back several times faster than its slow figure; the threshold sits
#: above what window noise moves a steady server's figure and below that jump.
STILL_SLOW = 1.5

#: A figure's relative error until its noise is measured (fewer than two windows or
#: steps): figures 10% apart are not told apart at once (on the bed the first plan sent
#: a chunk to one of three equally fast servers by their first step's scatter), and a
#: straggler at a quarter of the others' speed is planned for at once.
PRIOR_ERROR = 0.1

#: Steps of a server's workers' bounds before their scatter counts as its noise. From two
#: or three steps a median deviation is half a difference or less: at clock 3 the test
#: bed's PSLD had an error of 0.012 (0.1 to 0.17 from 16 steps) and the simulator's
#: 0.023, and there a plan saving 9% of the step passed as beyond twice the noise (issue
#: 38: one of the slow server's last two chunks moved). Until then the errors are
#: :data:`PRIOR_ERROR`, as at the first move: a straggler 1.33 times slower or more is
#: still told apart at once.
MIN_SCATTER_STEPS = 4

#: Found as slow each of this many re-measurements in a row, a server straggles for
#: good (a lasting straggler, which psld may retire when it owns nothing). Once could be
#: a passing slowdown that outlasted one idle period; twice spans that period and a
#: doubled one (see ``SpeedEstimator.observe``'s patience).
LASTING_RECHECKS = 2


class SpeedEstimator:
    """Each server's effective speed, from what the servers and the workers report.

    **Servers** report their total busy seconds and bytes handled; successive reports
    make window speeds (bytes per busy second), and a server's figure is the median of
    its last ``keep`` windows of its current level (one wild window, a pause or a burst,
    does not move it). A change test on the latest windows (:mod:`.change`) starts a
    new level once ``confirm`` windows in a row lie beyond the level's own noise: a
    server that slowed down is seen at its second slow window, not its third as by a
    median of five. Windows with less than ``min_busy_s`` of work are ignored.

    **Workers** time, per step and server, their requests from push to reply read
    (:meth:`observe_step`, every worker's figures of one step together), which sees
    what busy seconds cannot: time on a slow link, and a server that slowed down since
    its last windows, one step after it did. A worker reads replies only while it
    waits, so its figures bracket the speed rather than measure it: the bytes over the
    span from the first push are a lower bound (the span may hold compute and other
    workers' lateness), the bytes over the span from when the wait began roughly an
    upper one (what the server did before is left out). They correct the servers'
    figure only where they disagree with it by more than ``disagree`` times: a lower
    bound that high says the figure is stale (a straggler recovered); an upper bound
    that low says the server is slower than its busy time shows. The bounds are the
    widest of the last ``keep_steps`` steps' (each of those steps must call for it);
    with the default of 1 the last step alone corrects, so a straggler is planned for
    one step after it shows, and an odd step's plan is judged by its trial like any.

    **Noise** (:meth:`errors`): each figure's relative standard error, what a plan's
    gain must beat. A busy-time figure's comes from the scatter of its windows; a
    figure the workers corrected, from the scatter of the workers' bounds over the last
    ``scatter_steps`` steps, each server's from its own median, pooled over the servers
    (the machine's noise is shared; a few steps of one server would not tell it).

    Not thread-safe.
    """

    def __init__(
        self,
        keep: int = 5,
        min_busy_s: float = 0.005,
        idle_reports: int = 12,
        keep_steps: int = 1,
        disagree: float = 2.0,
        change: ChangeSettings | None = None,
        scatter_steps: int = 16,
    ) -> None:
        self.keep = keep
        self.scatter_steps = scatter_steps
        # Per server: the logs of the workers' (lower, upper) bounds, step by step.
        self._scatter: dict[int, collections.deque[tuple[float, float]]] = {}
        history = max(2, min(5, keep))
        self.change = change or ChangeSettings(keep=max(keep, history), history=history)
        self.min_busy_s = min_busy_s
        self.idle_reports = idle_reports
        self.keep_steps = keep_steps
        self.disagree = disagree
        self._last: dict[int, tuple[float, float]] = {}
        self._windows: dict[int, LevelTracker] = {}
        self._steps: dict[int, collections.deque[tuple[float, float]]] = {}
        self._idle: dict[int, int] = {}
        # Per server: reports of idleness before its figure is dropped (doubles each
        # time a server comes back as slow as it was), and the figure last dropped.
        self._patience: dict[int, int] = {}
        self._dropped: dict[int, float] = {}
        self._slow_rechecks: dict[int, int] = {}

    def observe(self, server: int, busy_s: float, nbytes: float) -> None:
        """Take server ``server``'s cumulative counters."""
        last = self._last.get(server)
        if last is None or busy_s < last[0]:
            self._last[server] = (busy_s, nbytes)
            return
        dbusy, dbytes = busy_s - last[0], nbytes - last[1]
        if dbusy < self.min_busy_s or dbytes <= 0:
            # Too little work to judge. A server idle this long may have changed speed
            # since it was measured: its old figure is dropped (it counts as unknown).
            self._idle[server] = self._idle.get(server, 0) + 1
            patience = self._patience.get(server, self.idle_reports)
            if self._idle[server] >= patience and server in self._windows:
                dropped = self.speed(server)
                if dropped is not None:
                    self._dropped[server] = dropped
                del self._windows[server]
                self._steps.pop(server, None)
            return
        self._idle[server] = 0
        self._last[server] = (busy_s, nbytes)
        was = self._dropped.pop(server, None)
        if was is not None:  # the first figure after a probe: is it still that slow?
            base = self.idle_reports
            slow = dbytes / dbusy < STILL_SLOW * was
            self._patience[server] = (
                min(self._patience.get(server, base) * 2, 64 * base) if slow else base
            )
            self._slow_rechecks[server] = self._slow_rechecks.get(server, 0) + 1 if slow else 0
        windows = self._windows.get(server)
        if windows is None:
            windows = self._windows[server] = LevelTracker(self.change)
        windows.observe(dbytes / dbusy)

    def observe_step(self, server: int, nbytes: float, span_s: float, tail_s: float) -> None:
        """Take one step's worker-observed figures for ``server``: ``nbytes`` (every
        worker's pushes and replies) crossed within ``span_s`` seconds from the first
        push to the last reply, of which the last ``tail_s`` after the wait began."""
        if span_s > 0 and nbytes > 0:
            upper = nbytes / tail_s if tail_s > 0 else float("inf")
            self._steps.setdefault(server, collections.deque(maxlen=self.keep_steps)).append(
                (nbytes / span_s, upper)
            )
            if math.isfinite(upper):
                logs = (math.log(nbytes / span_s), math.log(upper))
                self._scatter.setdefault(
                    server, collections.deque(maxlen=self.scatter_steps)
                ).append(logs)

    def speed(self, server: int) -> float | None:
        """The server-reported estimate, or None before any full window."""
        w = self._windows.get(server)
        return w.figure() if w is not None else None

    def errors(self, servers: int) -> list[float]:
        """Each figure's relative standard error (log space) for servers
        ``0..servers-1``, from the scatter of its windows (:meth:`LevelTracker.error`):
        what a plan's predicted gain must beat to be more than noise. A server with
        fewer than two windows, or a corrected figure while no server has
        :data:`MIN_SCATTER_STEPS` steps of bounds, gets :data:`PRIOR_ERROR` (nothing
        known of its noise yet).
        A figure the workers' bounds corrected has their scatter over
        ``sqrt(keep_steps)``. Never blocks."""
        busy = {s: v for s in range(servers) if (v := self.speed(s)) is not None}
        corrected = self._corrected(busy)
        out = []
        for s in range(servers):
            w = self._windows.get(s)
            error = w.error() if w is not None else None
            if s in busy and corrected[s] != busy[s]:  # one of the workers' bounds
                seen = self.observed(s)
                upper = seen is not None and corrected[s] == seen[1]
                scatter = self._bound_scatter(1 if upper else 0)
                error = None if scatter is None else scatter / math.sqrt(self.keep_steps)
            out.append(PRIOR_ERROR if error is None else error)
        return out

    def _bound_scatter(self, which: int) -> float | None:
        """The scatter (log space, a standard deviation) of one step's worker-observed
        bound (0: lower, 1: upper) about its server's median over the last
        ``scatter_steps`` steps, pooled over the servers that have
        :data:`MIN_SCATTER_STEPS` steps or more; None with none such."""
        deviations: list[float] = []
        for steps in self._scatter.values():
            if len(steps) >= MIN_SCATTER_STEPS:
                logs = [x[which] for x in steps]
                centre = statistics.median(logs)
                deviations.extend(abs(x - centre) for x in logs)
        if not deviations:
            return None
        return 1.4826 * statistics.median(deviations)

    def observed(self, server: int) -> tuple[float, float] | None:
        """The worker-observed bounds ``(lower, upper)`` of the server's speed over the
        last ``keep_steps`` steps (the widest: a correction needs every one of those
        steps to call for it, so one odd step makes none), or None before any step."""
        w = self._steps.get(server)
        if not w:
            return None
        return min(v[0] for v in w), max(v[1] for v in w)

    def _corrected(self, busy: dict[int, float]) -> dict[int, float]:
        out = dict(busy)
        for s, v in busy.items():
            seen = self.observed(s)
            if seen is None:
                continue
            lower, upper = seen
            if lower > v * self.disagree:
                out[s] = lower
            elif upper * self.disagree < v:
                out[s] = upper
        return out

    def slow_rechecks(self, server: int) -> int:
        """How many times in a row the server, re-measured after its figure was dropped
        for idleness, came back as slow as before: a lasting straggler, not a passing
        one, once it is :data:`LASTING_RECHECKS` or more (:meth:`lasting`)."""
        return self._slow_rechecks.get(server, 0)

    def lasting(self, servers: int) -> frozenset[int]:
        """Servers ``0..servers-1`` that straggle for good: found slow again each of the
        last :data:`LASTING_RECHECKS` times they were re-measured."""
        return frozenset(s for s in range(servers) if self.slow_rechecks(s) >= LASTING_RECHECKS)

    def unknown(self, servers: int) -> set[int]:
        """Servers without a current estimate (new, or idle for long)."""
        return {s for s in range(servers) if self.speed(s) is None}

    def speeds(self, servers: int) -> list[float] | None:
        """Estimates for servers ``0..servers-1``: the server-reported figures, corrected
        by the worker-observed ones (see the class); a server not yet measured gets the
        median of the others. None while no server is measured."""
        known = self._corrected({s: v for s in range(servers) if (v := self.speed(s)) is not None})
        if not known:
            return None
        fill = statistics.median(known.values())
        return [known.get(s, fill) for s in range(servers)]
