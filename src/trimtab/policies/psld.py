"""PSLD: parameter-server load balancing from measured server speeds (pure policies).

The coordinator feeds a :class:`PsldController` what the servers report (cumulative busy
seconds and bytes handled, see :class:`SpeedEstimator`) and what the workers report
(step times), and asks it at step boundaries whether to move chunks. The controller's
decisions come from :func:`rebalance`, a pure function of chunk sizes, owners and
speeds:

* **exploitation**: the predicted time of a server is the bytes it handles per step over
  its measured speed; chunks move, best fit first, from the server predicted slowest to
  the one where they finish soonest, while that lowers the slowest server's time;
* **cost-awareness**: a plan is kept only if the time it saves over the next
  ``horizon`` steps beats the time its migration takes (the moved bytes at the speeds of
  the two servers involved);
* **rollback**: after a plan is applied the controller compares the measured step time
  over the next ``window`` steps with the one before; a plan that made things worse by
  more than ``tolerance`` is undone, unless the speeds measured meanwhile blame a server
  that slowed down since (the old map would be slower too);
* **trust**: a server carrying less than half the median load receives at most up to
  the median in one plan (its speed was measured on a light load);
* **exploration**: after ``explore_every`` steps without a change, one chunk moves
  from the slowest server to the least loaded one when the model cannot rule that out
  (it predicts the step within ``explore_slack`` either way): its figure, measured on a
  light load, is the least certain. The move is kept only if the measured step time
  improved, else rolled back (and not tried again soon);
* **one fewer server**: with more active servers than the job started with, that
  quiet period may instead try the map without the slowest server (every chunk off it)
  when the others are predicted to carry its load within ``explore_slack``: kept if
  the measured step is no slower (a server freed for the same speed), else rolled back.
  A server left with nothing is retired once it is known to straggle for good (found
  slow each time it was re-measured; :meth:`PsldController.idle_server`).

Nothing here does I/O or keeps time; every input is an argument, so the same code runs
in the coordinator, in unit tests and in a simulator.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Mapping, Sequence


def server_times(
    sizes: Sequence[int], owners: Sequence[int], speeds: Sequence[float]
) -> list[float]:
    """Predicted seconds each server needs per step for the bytes it owns."""
    load = [0.0] * len(speeds)
    for size, owner in zip(sizes, owners, strict=True):
        load[owner] += size
    return [b / max(v, 1e-12) for b, v in zip(load, speeds, strict=True)]


def slowest(times: Sequence[float]) -> int:
    """The index of the largest of ``times`` (the server predicted slowest)."""
    return max(range(len(times)), key=times.__getitem__)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A proposed placement and what it is predicted to do.

    Attributes:
        owners: the new owner of every chunk.
        moved_bytes: bytes that change servers.
        before_s / after_s: the slowest server's predicted time per step, now and after.
        cost_s: predicted time the migration itself takes.
    """

    owners: tuple[int, ...]
    moved_bytes: int
    before_s: float
    after_s: float
    cost_s: float

    @property
    def gain_s(self) -> float:
        """Predicted seconds saved per step."""
        return self.before_s - self.after_s


def rebalance(
    sizes: Sequence[int],
    owners: Sequence[int],
    speeds: Sequence[float],
    *,
    active: Sequence[bool] | None = None,
    max_moves: int | None = None,
    probe: frozenset[int] = frozenset(),
) -> Plan:
    """Best-fit moves from the slowest server to where each chunk finishes soonest.

    ``sizes[c]`` is what chunk ``c`` costs its server per step (bytes), ``speeds[s]``
    server ``s``'s measured bytes per second. Servers with ``active[s]`` False (being
    drained) receive nothing and give away everything. Pure; never raises for valid
    input; returns a plan with no moves when nothing helps.
    Servers in ``probe`` (speed unknown: new, or idle for long) receive at most one
    chunk: their speed is measured on it before they are trusted with more. A server
    carrying less than half the median load of the loaded servers is filled up to that
    median at most: its speed was measured on a light load, which passes in bursts and hides
    queueing, and says little about many times that load; the next plan, made with its
    speed measured at the median, may give it more.
    """
    n = len(speeds)
    active = [True] * n if active is None else list(active)
    new = list(owners)
    load = [0.0] * n
    for size, owner in zip(sizes, new, strict=True):
        load[owner] += size

    def t(s: int) -> float:
        return load[s] / max(speeds[s], 1e-12)

    targets = [s for s in range(n) if active[s]]
    if not targets:
        raise ValueError("rebalance needs at least one active server")
    # Draining servers first: everything they own must go.
    for c, owner in enumerate(new):
        if not active[owner]:
            dest = min(targets, key=lambda s: (load[s] + sizes[c]) / max(speeds[s], 1e-12))
            load[owner] -= sizes[c]
            load[dest] += sizes[c]
            new[c] = dest
    before = max(server_times(sizes, owners, speeds))
    carried = sorted(load[s] for s in targets if load[s] > 0)
    typical = statistics.median(carried) if carried else float("inf")
    cap = [typical if load[s] < typical / 2 else float("inf") for s in range(n)]
    received = [0] * n
    for o in new:
        if o in probe:
            received[o] += 1  # a probed server that owns something is measured already
    moves = 0
    while max_moves is None or moves < max_moves:
        # Lower the slowest server's time; the receiver must end below where the
        # slowest was. Each move makes the sorted times smaller, so this ends.
        worst = max(targets + [s for s in range(n) if not active[s]], key=t)
        current = t(worst)
        best: tuple[float, int, int] | None = None
        for c in (c for c, o in enumerate(new) if o == worst):
            for dest in targets:
                if dest == worst or (dest in probe and received[dest]):
                    continue
                if load[dest] + sizes[c] > cap[dest]:
                    continue
                after = max(
                    (load[worst] - sizes[c]) / max(speeds[worst], 1e-12),
                    (load[dest] + sizes[c]) / max(speeds[dest], 1e-12),
                )
                if after < current * (1 - 1e-9) and (best is None or after < best[0]):
                    best = (after, c, dest)
        if best is None:
            break
        _, c, dest = best
        received[dest] += 1
        load[worst] -= sizes[c]
        load[dest] += sizes[c]
        new[c] = dest
        moves += 1
    moved = [c for c in range(len(new)) if new[c] != owners[c]]
    cost = sum(
        sizes[c] / max(speeds[owners[c]], 1e-12) + sizes[c] / max(speeds[new[c]], 1e-12)
        for c in moved
    )
    return Plan(
        owners=tuple(new),
        moved_bytes=sum(sizes[c] for c in moved),
        before_s=before,
        after_s=max(server_times(sizes, new, speeds)),
        cost_s=cost,
    )


class SpeedEstimator:
    """Each server's effective speed, from what the servers and the workers report.

    **Servers** report their total busy seconds and bytes handled; successive reports
    make window speeds (bytes per busy second), and a server's figure is the median of
    its last ``keep`` windows (one wild window, a pause or a burst, does not move it).
    Windows with less than ``min_busy_s`` of work are ignored.

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

    Not thread-safe.
    """

    def __init__(
        self,
        keep: int = 5,
        min_busy_s: float = 0.005,
        idle_reports: int = 12,
        keep_steps: int = 1,
        disagree: float = 2.0,
    ) -> None:
        self.keep = keep
        self.min_busy_s = min_busy_s
        self.idle_reports = idle_reports
        self.keep_steps = keep_steps
        self.disagree = disagree
        self._last: dict[int, tuple[float, float]] = {}
        self._windows: dict[int, collections.deque[float]] = {}
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
            slow = dbytes / dbusy < 1.5 * was
            self._patience[server] = (
                min(self._patience.get(server, base) * 2, 64 * base) if slow else base
            )
            self._slow_rechecks[server] = self._slow_rechecks.get(server, 0) + 1 if slow else 0
        self._windows.setdefault(server, collections.deque(maxlen=self.keep)).append(dbytes / dbusy)

    def observe_step(self, server: int, nbytes: float, span_s: float, tail_s: float) -> None:
        """Take one step's worker-observed figures for ``server``: ``nbytes`` (every
        worker's pushes and replies) crossed within ``span_s`` seconds from the first
        push to the last reply, of which the last ``tail_s`` after the wait began."""
        if span_s > 0 and nbytes > 0:
            upper = nbytes / tail_s if tail_s > 0 else float("inf")
            self._steps.setdefault(server, collections.deque(maxlen=self.keep_steps)).append(
                (nbytes / span_s, upper)
            )

    def speed(self, server: int) -> float | None:
        """The server-reported estimate, or None before any full window."""
        w = self._windows.get(server)
        return statistics.median(w) if w else None

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
        one, once it is 2 or more."""
        return self._slow_rechecks.get(server, 0)

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

    def forget(self, server: int) -> None:
        """Drop a server's history (it left, or its load changed shape)."""
        self._windows.pop(server, None)
        self._steps.pop(server, None)
        self._last.pop(server, None)


def explore_move(
    sizes: Sequence[int],
    owners: Sequence[int],
    speeds: Sequence[float],
    *,
    active: Sequence[bool] | None = None,
    slack: float = 0.05,
) -> tuple[int, ...] | None:
    """One chunk from the server predicted slowest to the least loaded active server,
    if that server carries less than the median load and the slowest predicted time
    after the move is within ``slack`` of now (a move the measurements cannot rule
    out); else None. Pure.

    The least loaded server is the one whose speed figure is least certain: it was
    measured on a light load, which passes in bursts. Of the slowest server's chunks the
    smallest moves (the least risk)."""
    n = len(speeds)
    live = [True] * n if active is None else list(active)
    times = server_times(sizes, owners, speeds)
    worst = slowest(times)
    load = [t * max(v, 1e-12) for t, v in zip(times, speeds, strict=True)]
    others = [s for s in range(n) if live[s] and s != worst]
    mine = [c for c, o in enumerate(owners) if o == worst]
    if not others or not mine:
        return None
    dest = min(others, key=lambda s: (load[s], s))
    carried = [load[s] for s in range(n) if live[s] and load[s] > 0]
    if carried and load[dest] >= statistics.median(carried):
        return None  # no lightly loaded server: every figure was measured under load
    c = min(mine, key=lambda c: (sizes[c], c))
    after = list(times)
    after[worst] = (load[worst] - sizes[c]) / max(speeds[worst], 1e-12)
    after[dest] = (load[dest] + sizes[c]) / max(speeds[dest], 1e-12)
    if max(after) > times[worst] * (1 + slack):
        return None
    new = list(owners)
    new[c] = dest
    return tuple(new)


def drain_move(
    sizes: Sequence[int],
    owners: Sequence[int],
    speeds: Sequence[float],
    *,
    active: Sequence[bool] | None = None,
    slack: float = 0.05,
) -> tuple[int, ...] | None:
    """Every chunk off the slowest active server (the lowest speed), if the other
    active servers are predicted to carry its load with the slowest time within
    ``slack`` of now; else None. Pure.

    One fewer server is worth trying when the model says the step stays as fast: the
    server can then be given back. Its chunks go where :func:`rebalance` puts a
    draining server's."""
    n = len(speeds)
    live = [True] * n if active is None else list(active)
    candidates = [s for s in range(n) if live[s]]
    if len(candidates) < 2:
        return None
    victim = min(candidates, key=lambda s: (speeds[s], -s))
    if victim not in owners:
        return None  # it carries nothing already: nothing to try, only to retire
    without = [live[s] and s != victim for s in range(n)]
    plan = rebalance(sizes, owners, speeds, active=without)
    now = max(server_times(sizes, owners, speeds))
    after = max(server_times(sizes, plan.owners, speeds))
    if victim in plan.owners or after > now * (1 + slack):
        return None
    return plan.owners


@dataclasses.dataclass
class _Trial:
    previous: tuple[int, ...]
    tried: tuple[int, ...]
    step_before: float
    started: int
    speeds: tuple[float, ...]  # the speeds it was made with
    explore: bool = False  # kept only if the step got faster
    drain: bool = False  # one fewer server: kept if the step got no slower


class PsldController:
    """When to move what. Not thread-safe; the coordinator's loop calls it.

    Args:
        interval: steps between decisions.
        horizon: steps over which a plan's gain must repay its migration cost.
        window: steps of measured step time compared before and after a plan.
        tolerance: a plan that makes the step this much slower is rolled back.
        min_gain: plans saving less than this fraction of the step are not worth it.
        min_gain_s: ...nor plans saving less than this many seconds a step: below it
            the figures are noise (servers of a small model are idle most of a step).
        straggler_ratio: a server below this fraction of the median speed straggles.
        explore_every: steps without a change before an exploratory move (0: never).
        explore_slack: the model's error allowed for an exploratory move: it is made
            if predicted at most this much slower.
        min_servers: the policy drains no server below this many active ones (the
            job's starting count: the servers it adds are the ones it may give back).
    """

    def __init__(
        self,
        interval: int = 5,
        horizon: int = 50,
        window: int = 5,
        tolerance: float = 0.05,
        min_gain: float = 0.05,
        min_gain_s: float = 0.001,
        straggler_ratio: float = 0.5,
        explore_every: int = 20,
        explore_slack: float = 0.05,
        min_servers: int = 1,
    ) -> None:
        self.straggler_ratio = straggler_ratio
        self.min_servers = min_servers
        self.drains = 0
        self._empty_since: dict[int, int] = {}  # active server -> owns nothing since
        self.explore_every = explore_every
        self.explore_slack = explore_slack
        self.explorations = 0
        self._quiet_since = 0  # the clock of the last change of map or trial
        self.interval = interval
        self.horizon = horizon
        self.window = window
        self.tolerance = tolerance
        self.min_gain = min_gain
        self.min_gain_s = min_gain_s
        self._steps: dict[int, float] = {}
        self._last_decision = 0
        self._trial: _Trial | None = None
        self.rollbacks = 0
        self._bans: dict[tuple[int, ...], tuple[int, int]] = {}  # map -> (until, length)
        self._max_moves: int | None = None  # halved after each rollback
        self._halved_for: int | None = None  # ...while this server stays the slowest

    def observe_step(self, clock: int, step_s: float) -> None:
        """Record the step time of clock ``clock`` (the slowest worker's, ideally)."""
        self._steps[clock] = max(step_s, self._steps.get(clock, 0.0))
        for old in [k for k in self._steps if k < clock - 4 * self.window - self.interval]:
            del self._steps[old]

    def _median_step(self, start: int, end: int) -> float | None:
        xs = [v for k, v in self._steps.items() if start <= k < end]
        return statistics.median(xs) if len(xs) >= max(1, (end - start) // 2) else None

    def decide(
        self,
        clock: int,
        sizes: Sequence[int],
        owners: Sequence[int],
        speeds: Sequence[float] | None,
        *,
        active: Sequence[bool] | None = None,
        probe: frozenset[int] = frozenset(),
    ) -> tuple[int, ...] | None:
        """The new owners to migrate to at ``clock``, or None to stay. Pure given the
        observations so far."""
        if self._trial is not None and self._overtaken(self._trial, sizes, speeds):
            # A server the plan gave nothing slowed down during the trial (a straggler
            # arrived): the trial can no longer be judged, and waiting it out leaves the
            # straggler in place. Plan for what is measured now.
            self._trial = None
            self._max_moves = None
        if self._trial is not None:
            trial = self._trial
            if clock < trial.started + self.window:
                return None
            after = self._median_step(trial.started + 1, clock + 1)
            self._trial = None
            self._last_decision = clock
            self._quiet_since = clock
            # Slower steps are the plan's fault unless a server slowed meanwhile (a
            # straggler arrived): the speeds measured since predict the old map slower
            # than when the plan was made, and the tried map still the better one.
            # Undoing the plan then would only add to the slowdown.
            exonerated = False
            if speeds is not None and len(speeds) == len(trial.speeds):
                was = max(server_times(sizes, trial.previous, trial.speeds))
                old_now = max(server_times(sizes, trial.previous, speeds))
                tried_now = max(server_times(sizes, trial.tried, speeds))
                exonerated = old_now > was * (1 + self.tolerance) and tried_now < old_now
            # An exploratory move must pay for itself; a plan, or one fewer server (which
            # pays by the server it frees), must not make things worse.
            strict = trial.explore and not trial.drain
            limit = trial.step_before * (1 if strict else 1 + self.tolerance)
            if after is not None and after >= limit and not exonerated:
                self.rollbacks += 1
                # Do not try that map again soon: twice as long each time it fails.
                first = self.explore_every if trial.explore else self.window
                ban = self._bans.get(trial.tried, (0, first))[1] * 2
                self._bans[trial.tried] = (clock + ban, ban)
                if not trial.explore:
                    # The speeds overrated a receiver: the next plan may move half as
                    # many chunks (LB-BSP's step-halving on a reversal), down to one.
                    moved = sum(a != b for a, b in zip(trial.previous, trial.tried, strict=True))
                    self._max_moves = max(1, moved // 2)
                    self._halved_for = slowest(server_times(sizes, trial.previous, trial.speeds))
                return trial.previous
            self._max_moves = None  # it helped: plans may be whole again
            return None
        if speeds is None or clock - self._last_decision < self.interval:
            return None
        self._last_decision = clock
        if slowest(server_times(sizes, owners, speeds)) != self._halved_for:
            # Halving damps a plan that overshot around one bottleneck; a different
            # server slowest (a straggler appeared elsewhere) is a new problem: whole
            # plans again, or each of its moves waits out a trial window of its own.
            self._max_moves = None
        plan = rebalance(
            sizes, owners, speeds, active=active, probe=probe, max_moves=self._max_moves
        )
        draining = active is not None and not all(active)
        if plan.owners == tuple(owners) or self._banned(plan.owners, clock):
            return self._explore(clock, sizes, owners, speeds, active)
        probing = any(o in probe and o != was for o, was in zip(plan.owners, owners, strict=True))
        if (
            not draining
            and not probing
            and (
                plan.gain_s < max(self.min_gain * plan.before_s, self.min_gain_s)
                or plan.gain_s * self.horizon <= plan.cost_s
            )
        ):
            return self._explore(clock, sizes, owners, speeds, active)
        self._quiet_since = clock
        before = self._median_step(clock - self.window, clock + 1)
        latest = max(self._steps) if self._steps else None
        if before is not None and latest is not None:
            # A plan made on a slowdown seen one step ago (the workers' figures show it
            # that soon) is judged against that step, not against the window's median
            # of the steps before the slowdown, which no map could match any more.
            before = max(before, self._steps[latest])
        # A probe (one chunk to a server of unknown speed) is judged by the speed it
        # measures, at the next decision, not by the step time: it is not expected to
        # shorten the step, and noise would roll it back and ban it.
        if before is not None and not draining and not probing:
            self._trial = _Trial(tuple(owners), plan.owners, before, clock, tuple(speeds))
        return plan.owners

    def _banned(self, owners: tuple[int, ...], clock: int) -> bool:
        return self._bans.get(owners, (0, 0))[0] > clock

    def _explore(
        self,
        clock: int,
        sizes: Sequence[int],
        owners: Sequence[int],
        speeds: Sequence[float],
        active: Sequence[bool] | None,
    ) -> tuple[int, ...] | None:
        """An exploratory move, when the map has been quiet ``explore_every`` steps."""
        if self.explore_every <= 0 or clock - self._quiet_since < self.explore_every:
            return None
        if active is not None and not all(active):
            return None
        self._quiet_since = clock  # one try per quiet period, whatever comes of it
        before = self._median_step(clock - self.window, clock + 1)
        if before is None:
            return None
        live = [True] * len(speeds) if active is None else list(active)
        if sum(live) > self.min_servers:
            tried = drain_move(sizes, owners, speeds, active=live, slack=self.explore_slack)
            if tried is not None and not self._banned(tried, clock):
                self.drains += 1
                self._trial = _Trial(
                    tuple(owners), tried, before, clock, tuple(speeds), explore=True, drain=True
                )
                return tried
        if max(server_times(sizes, owners, speeds)) * self.explore_slack < self.min_gain_s:
            return None  # at best it could save less than a plan must
        tried = explore_move(sizes, owners, speeds, active=active, slack=self.explore_slack)
        if tried is None or self._banned(tried, clock):
            return None
        self.explorations += 1
        self._trial = _Trial(tuple(owners), tried, before, clock, tuple(speeds), explore=True)
        return tried

    def idle_server(
        self,
        clock: int,
        owners: Sequence[int],
        active: Sequence[bool],
        lasting: frozenset[int],
    ) -> int | None:
        """Scale in? An active server that owns nothing, has owned nothing for
        ``window`` steps, and is a lasting straggler (``lasting``: found as slow each time
        it was re-measured, see :meth:`SpeedEstimator.slow_rechecks`), while no trial
        runs and more than ``min_servers`` servers are active; else None. A passing
        straggler is left alone: its re-measurement finds it fast and the plans use it
        again. Call it at every step boundary."""
        held = set(owners)
        for s, a in enumerate(active):
            if not a or s in held:
                self._empty_since.pop(s, None)
            elif s not in self._empty_since:
                self._empty_since[s] = clock
        if self._trial is not None or sum(active) <= self.min_servers:
            return None
        for s, since in sorted(self._empty_since.items()):
            if s in lasting and clock - since >= self.window:
                return s
        return None

    @staticmethod
    def _overtaken(trial: _Trial, sizes: Sequence[int], speeds: Sequence[float] | None) -> bool:
        """Whether, by the speeds measured now, the slowest server of the tried map is
        one the plan gave nothing and is predicted half as slow again as the slowest was
        when the plan was made."""
        if speeds is None or len(speeds) != len(trial.speeds):
            return False
        now = server_times(sizes, trial.tried, speeds)
        then = max(server_times(sizes, trial.tried, trial.speeds))
        worst = slowest(now)
        receivers = {o for o, was in zip(trial.tried, trial.previous, strict=True) if o != was}
        return worst not in receivers and now[worst] > 1.5 * then

    def wants_server(self, speeds: Sequence[float] | None, active: Sequence[bool]) -> bool:
        """Scale out? True while an active server runs below ``straggler_ratio`` of the
        median active speed: adding a server gives its share of the load somewhere."""
        if speeds is None:
            return False
        live = [v for v, a in zip(speeds, active, strict=True) if a]
        if len(live) < 2:
            return False
        return min(live) < self.straggler_ratio * statistics.median(live)


def chunk_costs(sizes: Mapping[int, int] | Sequence[int], workers: int) -> list[int]:
    """Bytes a chunk costs its server per step: every worker's push and reply."""
    values = list(sizes.values()) if isinstance(sizes, Mapping) else list(sizes)
    return [2 * workers * b for b in values]
