"""PSLD's controller: when to move which chunks, judged by the step times that follow
(trials, rollback, bans, move halving, exploration, one-fewer-server trials). Pure: the
coordinator feeds it step times and speeds and asks it at step boundaries."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence

from trimtab.policies.psld.model import (
    Plan,
    drain_move,
    explore_move,
    rebalance,
    server_times,
    slowest,
)

#: Steps between decisions, so that PSLD reacts within two steps of a straggler: the
#: workers' figures show a slowdown one step after it starts
#: (``SpeedEstimator.keep_steps``), and a decision at every step boundary acts on them
#: at once. A migration holds from the step after the one under way at its boundary
#: (its pushes already on their way stay with the old owners), so a straggler of step s
#: is off the map from step s + 2. Every other step (2, until issue 20) added a step
#: half the time, when migrations took effect at once and paid in moved round trips.
DECIDE_EVERY = 1

#: A trial is overtaken (abandoned unjudged) when a server the plan gave nothing is
#: predicted this many times slower than the tried map's slowest was when it was made:
#: a straggler arrived, well beyond the ``tolerance`` by which a trial is judged.
OVERTAKEN = 1.5


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
        explore_every: steps without a change before an exploratory move (0: never).
        explore_slack: the model's error allowed for an exploratory move: it is made
            if predicted at most this much slower.
        min_servers: the policy drains no server below this many active ones (the
            job's starting count: the servers it adds are the ones it may give back).
        significance: figures within this many standard errors (``decide``'s
            ``errors``) of each other are taken as equal (:meth:`pooled`), and a plan
            must save more than this many errors of the figures it compares. Without
            it, plans
            followed the scatter of the figures, not the servers' speeds: on a shared
            machine PSLD moved chunks among equally fast servers every few steps, each
            move a trial that noise then kept or rolled back (issue 38).
        confirm: decisions running that must call for a plan relieving the same
            server before it is made (1: at once), where the plan beats the noise by
            less than ``at_once`` errors. A server's figure dips for a single step now
            and then on a shared machine (the figures' tails are heavier than their
            error says): on issue 38's test bed such dips gave plans of 2.1 to 4.5
            errors, made a step after the dip had passed and often moved back after
            their trial. Waiting for a second call costs a mild straggler one step.
        at_once: a plan beating the noise by this many errors (as
            ``significance`` counts them) is made at once: a 4 x straggler's first
            plan is 6 errors even at the prior error (10%), and issue 20 asks PSLD to
            react within 2 steps. A join's rebalance, a probe and a drain are made at
            once too.
    """

    def __init__(
        self,
        interval: int = DECIDE_EVERY,
        horizon: int = 50,
        window: int = 5,
        tolerance: float = 0.05,
        min_gain: float = 0.05,
        min_gain_s: float = 0.001,
        explore_every: int = 20,
        explore_slack: float = 0.05,
        min_servers: int = 1,
        significance: float = 2.0,
        confirm: int = 2,
        at_once: float = 5.0,
    ) -> None:
        if confirm < 1:
            raise ValueError(f"confirm is a count of decisions (1 or more), not {confirm}")
        self.min_servers = min_servers
        self.confirm = confirm
        self.at_once = at_once
        #: The plan called for but not yet confirmed: (the clock of the decision that
        #: last called for it, the server it relieves, decisions running so far).
        self._called: tuple[int, int, int] | None = None
        self.significance = significance
        self.drains = 0
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

    @property
    def trial_running(self) -> bool:
        """Whether a tried map awaits its verdict (the step times of its window)."""
        return self._trial is not None

    def chunks_changed(self) -> None:
        """The job's chunk table grew (another optimizer's tensors): a trial's maps
        name fewer chunks than there are, so it is dropped unjudged (nothing rolls back
        to it) and move halving starts afresh. Never blocks."""
        self._trial = None
        self._max_moves = None
        self._halved_for = None

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
        errors: Sequence[float] | None = None,
    ) -> tuple[int, ...] | None:
        """The new owners to migrate to at ``clock``, or None to stay. Pure given the
        observations so far. ``errors``: each speed figure's relative standard error
        (:meth:`SpeedEstimator.errors`; None: figures taken as exact): servers not
        told apart plan as equally fast (:meth:`pooled`), and a plan must save more
        than :attr:`significance` times the error of the figures it compares. Never
        blocks; raises nothing of its own."""
        if speeds is not None and errors is not None:
            speeds, errors = self.pooled(speeds, errors)
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
        if not draining and not probing:
            margin = self._margin(plan, owners, errors)
            if margin <= self.significance:
                return self._explore(clock, sizes, owners, speeds, active)
            if margin < self.at_once and not self._confirmed(clock, sizes, owners, speeds):
                return None
        self._called = None
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

    def pooled(
        self, speeds: Sequence[float], errors: Sequence[float]
    ) -> tuple[list[float], list[float]]:
        """``speeds`` with the servers the measurements do not tell apart taken as
        equally fast, and each figure's error after that. Pure.

        Sorted by figure, neighbours whose figures differ (log space) by at most
        :attr:`significance` times their combined error form one group (a chain); each
        server of a group plans with the group's median figure, whose error is the
        members' largest over the root of their count. So equally fast servers' chunk
        counts, which are exact, decide between them, and a straggler beyond its noise
        keeps its own figure and error."""
        n = len(speeds)
        if self.significance <= 0 or n == 0 or min(speeds) <= 0:
            return list(speeds), list(errors)
        order = sorted(range(n), key=lambda s: speeds[s])
        groups: list[list[int]] = [[order[0]]]
        for a, b in itertools.pairwise(order):
            gap = math.log(speeds[b] / speeds[a])
            if gap <= self.significance * math.hypot(errors[a], errors[b]):
                groups[-1].append(b)
            else:
                groups.append([b])
        out, err = list(speeds), list(errors)
        for group in groups:
            figure = statistics.median(speeds[s] for s in group)
            error = max(errors[s] for s in group) / math.sqrt(len(group))
            for s in group:
                out[s], err[s] = figure, error
        return out, err

    def _margin(self, plan: Plan, owners: Sequence[int], errors: Sequence[float] | None) -> float:
        """By how many errors the plan's predicted gain, a fraction of the slowest
        server's time, beats the error of the figures it compares (the largest among
        the servers giving chunks and among those taking them, combined as
        independent errors); infinite where the figures are taken as exact. A plan is
        made only beyond :attr:`significance`. Pure."""
        if errors is None or self.significance <= 0 or plan.before_s <= 0:
            return math.inf
        moved = [(was, now) for was, now in zip(owners, plan.owners, strict=True) if was != now]
        if not moved:
            return math.inf
        giving = max(errors[was] for was, _ in moved)
        taking = max(errors[now] for _, now in moved)
        noise = math.hypot(giving, taking) * plan.before_s
        return math.inf if noise <= 0 else plan.gain_s / noise

    def _confirmed(
        self, clock: int, sizes: Sequence[int], owners: Sequence[int], speeds: Sequence[float]
    ) -> bool:
        """Whether a plan called for at ``clock`` has been called for at
        :attr:`confirm` decisions running (the decision before this one called for a
        plan relieving the same slowest server), noting this call either way."""
        relieved = slowest(server_times(sizes, owners, speeds))
        seen = self._called
        running = 1
        if seen is not None and seen[0] == clock - self.interval and seen[1] == relieved:
            running = seen[2] + 1
        self._called = (clock, relieved, running)
        return running >= self.confirm

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

    @staticmethod
    def _overtaken(trial: _Trial, sizes: Sequence[int], speeds: Sequence[float] | None) -> bool:
        """Whether, by the speeds measured now, the slowest server of the tried map is
        one the plan gave nothing and is predicted :data:`OVERTAKEN` times as slow as the
        slowest was when the plan was made."""
        if speeds is None or len(speeds) != len(trial.speeds):
            return False
        now = server_times(sizes, trial.tried, speeds)
        then = max(server_times(sizes, trial.tried, trial.speeds))
        worst = slowest(now)
        receivers = {o for o, was in zip(trial.tried, trial.previous, strict=True) if o != was}
        return worst not in receivers and now[worst] > OVERTAKEN * then
