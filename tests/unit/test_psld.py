"""The PSLD policies: best-fit rebalancing, cost-awareness, rollback, speed estimates."""

from __future__ import annotations

import pytest

from trimtab import ConfigError
from trimtab.launch.job import LaunchConfig
from trimtab.policies.psld import (
    MIN_SPEED,
    PsldController,
    SpeedEstimator,
    drain_move,
    explore_move,
    fewest_moves,
    rebalance,
    server_times,
)
from trimtab.policies.scaling import SCALING, StragglerScaling
from trimtab.roles.coordinator import CoordinatorConfig


def test_rebalance_moves_load_off_a_slow_server() -> None:
    sizes = [100] * 8
    owners = [0, 0, 1, 1, 2, 2, 3, 3]
    speeds = [100.0, 100.0, 100.0, 25.0]  # server 3 at a quarter of the speed
    plan = rebalance(sizes, owners, speeds)
    assert plan.before_s == pytest.approx(8.0)  # 200 bytes at 25 B/s
    times = server_times(sizes, plan.owners, speeds)
    assert max(times) == plan.after_s < plan.before_s
    # Server 3 keeps nothing that would make it the slowest again.
    assert plan.owners.count(3) == 0 and plan.after_s == pytest.approx(3.0)
    assert plan.moved_bytes == 200 and plan.gain_s == pytest.approx(5.0)


def test_rebalance_leaves_a_balanced_map_alone() -> None:
    plan = rebalance([50, 50, 50, 50], [0, 1, 0, 1], [10.0, 10.0])
    assert plan.owners == (0, 1, 0, 1) and plan.moved_bytes == 0 and plan.cost_s == 0


def test_rebalance_follows_speed_not_bytes() -> None:
    # Greedy by bytes would split evenly; a 3x faster server should take about 3/4.
    sizes = [10] * 12
    plan = rebalance(sizes, [i % 2 for i in range(12)], [30.0, 10.0])
    assert plan.owners.count(0) == 9


def test_draining_server_gives_away_everything() -> None:
    plan = rebalance([10, 20, 30], [0, 1, 2], [10.0, 10.0, 10.0], active=[True, True, False])
    assert 2 not in plan.owners
    with pytest.raises(ConfigError, match="at least one active server"):
        rebalance([10], [0], [10.0], active=[False])


def test_a_server_measured_at_zero_speed_is_predicted_very_slow_not_a_division_error() -> None:
    assert server_times([10, 10], [0, 1], [0.0, 10.0]) == [10 / MIN_SPEED, 1.0]
    assert rebalance([10, 10], [0, 1], [0.0, 10.0]).owners == (1, 1)


def test_controller_waits_for_a_plan_worth_its_cost() -> None:
    sizes, owners = [100, 100, 100, 100], [0, 0, 1, 1]
    cheap = PsldController(confirm=1, interval=1, horizon=50)
    # Server 1 twice as slow: moving a chunk saves 1 s a step for 50 steps, costs ~15 s.
    assert cheap.decide(1, sizes, owners, [100.0, 50.0]) is not None
    short = PsldController(confirm=1, interval=1, horizon=2)  # 2 steps of gain never repay it
    assert short.decide(1, sizes, owners, [100.0, 50.0]) is None
    assert (
        PsldController(confirm=1, interval=1).decide(1, sizes, owners, None) is None
    )  # no data yet


SIZES, OWNERS = [100] * 8, (0, 0, 1, 1, 2, 2, 3, 3)
NOISY = [0.15] * 4  # figures' errors: the straggler's plan below is 3.6 of them


def test_a_plan_near_the_noise_is_made_when_two_decisions_running_call_for_it() -> None:
    slow = [100.0, 100.0, 100.0, 25.0]  # its plan: 0.625 of the step
    ctl = PsldController()  # confirm=2, at_once=5: the defaults
    assert ctl.decide(1, SIZES, OWNERS, slow, errors=NOISY) is None  # called for once
    plan = ctl.decide(2, SIZES, OWNERS, slow, errors=NOISY)
    assert plan is not None and plan.count(3) == 0  # twice running: the straggler's off


def test_a_plan_far_beyond_the_noise_is_made_at_once() -> None:
    slow = [100.0, 100.0, 100.0, 25.0]
    plan = PsldController().decide(1, SIZES, OWNERS, slow, errors=[0.05] * 4)  # 11 errors
    assert plan is not None and plan.count(3) == 0
    # Figures taken as exact (no errors) are beyond any noise.
    assert PsldController().decide(1, SIZES, OWNERS, slow) is not None


def test_a_one_step_dip_moves_nothing() -> None:
    even = [100.0] * 4
    dips = {3: [100.0, 100.0, 40.0, 100.0], 6: [100.0, 40.0, 100.0, 100.0]}
    ctl = PsldController()
    for clock in range(1, 10):  # a different server dips for one step, twice
        assert ctl.decide(clock, SIZES, OWNERS, dips.get(clock, even), errors=NOISY) is None
    # The same dip with confirm=1 moves chunks at once (what the default guards against).
    eager = PsldController(confirm=1)
    assert eager.decide(3, SIZES, OWNERS, dips[3], errors=NOISY) is not None


def test_a_call_to_relieve_another_server_starts_the_count_again() -> None:
    ctl = PsldController()
    assert ctl.decide(1, SIZES, OWNERS, [100.0, 100.0, 40.0, 100.0], errors=NOISY) is None
    assert ctl.decide(2, SIZES, OWNERS, [100.0, 100.0, 100.0, 40.0], errors=NOISY) is None
    assert ctl.decide(3, SIZES, OWNERS, [100.0, 100.0, 100.0, 40.0], errors=NOISY) is not None
    with pytest.raises(ValueError, match="confirm"):
        PsldController(confirm=0)


def test_controller_rolls_back_a_plan_that_made_steps_slower() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3)
    sizes, owners = [100, 100, 100, 100], [0, 0, 1, 1]
    for k in range(5):
        ctl.observe_step(k, 1.0)
    new = ctl.decide(4, sizes, owners, [100.0, 40.0])
    assert new is not None and new != tuple(owners)
    for k in range(5, 8):
        ctl.observe_step(k, 1.5)  # worse after the move (the estimate was wrong)
    assert ctl.decide(6, sizes, new, [100.0, 40.0]) is None  # still within the window
    assert ctl.decide(7, sizes, new, [100.0, 40.0]) == tuple(owners)
    assert ctl.rollbacks == 1


def test_controller_keeps_a_plan_that_helped() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3)
    sizes, owners = [100, 100, 100, 100], [0, 0, 1, 1]
    for k in range(5):
        ctl.observe_step(k, 1.0)
    new = ctl.decide(4, sizes, owners, [100.0, 40.0])
    assert new is not None
    for k in range(5, 8):
        ctl.observe_step(k, 0.7)
    assert ctl.decide(7, sizes, new, [100.0, 40.0]) is None and ctl.rollbacks == 0


def test_speed_estimator_takes_windows_and_ignores_one_outlier() -> None:
    est = SpeedEstimator(keep=5, min_busy_s=0.01)
    busy, nbytes = 0.0, 0.0
    est.observe(0, busy, nbytes)
    for window in range(6):
        busy += 0.1
        nbytes += 1e6 if window != 3 else 1e9  # one wild window
        est.observe(0, busy, nbytes)
    assert est.speed(0) == pytest.approx(1e7)
    est.observe(0, busy + 0.001, nbytes + 10)  # too little work to judge: ignored
    assert est.speed(0) == pytest.approx(1e7)
    assert est.speeds(2) == [pytest.approx(1e7), pytest.approx(1e7)]  # unmeasured: median
    assert SpeedEstimator().speeds(2) is None


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"placement": "psld", "consistency": "asp"}, "use it with --mode bsp"),
        ({"rebalance_every": 3, "consistency": "saps"}, "use it with --mode bsp"),
        ({"servers": 2, "max_servers": 3, "consistency": "asp"}, "use it with --mode bsp"),
        ({"servers": 3, "max_servers": 2}, "at least --servers"),
        ({"stragglers": ("server:4:bandwidth=1MB/s",)}, "only 2 servers"),
    ],
)
def test_launch_config_refuses_what_migration_cannot_do(kwargs: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        LaunchConfig(**kwargs)


def test_coordinator_config_checks_elastic_bounds() -> None:
    assert CoordinatorConfig(2, 2, "j").max_servers == 2
    with pytest.raises(ConfigError, match="below num_servers"):
        CoordinatorConfig(2, 3, "j", max_servers=2)
    with pytest.raises(ConfigError, match="use it with --mode bsp"):
        CoordinatorConfig(2, 2, "j", placement="psld", consistency="ssp")


def test_a_server_of_unknown_speed_is_probed_with_one_chunk() -> None:
    sizes, owners = [100] * 6, [0, 0, 0, 1, 1, 1]
    speeds = [100.0, 100.0, 100.0]  # server 2 unknown: filled with the median
    full = rebalance(sizes, owners, speeds)
    probed = rebalance(sizes, owners, speeds, probe=frozenset({2}))
    assert full.owners.count(2) == 2 and probed.owners.count(2) == 1


def test_an_idle_server_estimate_is_forgotten() -> None:
    est = SpeedEstimator(keep=3, min_busy_s=0.01, idle_reports=3)
    est.observe(1, 0.0, 0.0)
    est.observe(1, 0.1, 1e6)
    assert est.speed(1) == pytest.approx(1e7) and est.unknown(2) == {0}
    for _ in range(3):
        est.observe(1, 0.1, 1e6)  # no work since
    assert est.speed(1) is None and est.unknown(2) == {0, 1}


def test_controller_probes_an_unknown_server_even_without_predicted_gain() -> None:
    sizes, owners = [100] * 6, [0, 0, 0, 1, 1, 1]
    ctl = PsldController(confirm=1, interval=1)
    # Server 2 measured slow: nothing to gain from giving it work.
    assert ctl.decide(1, sizes, owners, [100.0, 100.0, 10.0]) is None
    # Idle for long, its figure was dropped (filled with the median): one chunk probes
    # it, though moving one chunk does not lower the slowest server's time.
    new = ctl.decide(2, sizes, owners, [100.0, 100.0, 100.0], probe=frozenset({2}))
    assert new is not None and new.count(2) == 1


def test_a_server_found_slow_again_is_probed_less_often() -> None:
    est = SpeedEstimator(keep=3, min_busy_s=0.01, idle_reports=2)
    busy, nbytes = 0.0, 0.0
    est.observe(0, busy, nbytes)

    def work(speed: float) -> None:
        nonlocal busy, nbytes
        busy, nbytes = busy + 0.1, nbytes + 0.1 * speed
        est.observe(0, busy, nbytes)

    def idle_until_forgotten() -> int:
        reports = 0
        while est.speed(0) is not None:
            est.observe(0, busy, nbytes)
            reports += 1
        return reports

    work(1e6)
    assert idle_until_forgotten() == 2
    assert est.slow_rechecks(0) == 0
    work(1e6)  # probed: as slow as before
    assert idle_until_forgotten() == 4
    assert est.slow_rechecks(0) == 1 and est.lasting(1) == frozenset()  # may be passing
    work(1e6)
    assert idle_until_forgotten() == 8
    assert est.slow_rechecks(0) == 2  # a lasting straggler: psld may retire it when idle
    assert est.lasting(1) == frozenset({0})
    work(1e8)  # probed: fast now; patience back to its base
    assert idle_until_forgotten() == 2
    assert est.slow_rechecks(0) == 0 and est.lasting(1) == frozenset()


def test_a_rolled_back_map_is_not_tried_again_soon() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3)
    sizes, owners = [100, 100, 100, 100], [0, 0, 1, 1]
    for k in range(5):
        ctl.observe_step(k, 1.0)
    tried = ctl.decide(4, sizes, owners, [100.0, 40.0])
    assert tried is not None
    for k in range(5, 8):
        ctl.observe_step(k, 1.5)
    assert ctl.decide(7, sizes, tried, [100.0, 40.0]) == tuple(owners)  # rolled back
    for k in range(8, 20):
        ctl.observe_step(k, 1.0)
    assert ctl.decide(9, sizes, owners, [100.0, 40.0]) is None  # banned for 6 steps
    assert ctl.decide(14, sizes, owners, [100.0, 40.0]) == tried  # then tried again


def test_a_probe_is_judged_by_its_speed_not_rolled_back_by_step_time() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3)
    sizes, owners = [100] * 6, [0, 0, 0, 1, 1, 1]
    for k in range(5):
        ctl.observe_step(k, 1.0)
    probe = ctl.decide(4, sizes, owners, [100.0, 100.0, 100.0], probe=frozenset({2}))
    assert probe is not None and probe.count(2) == 1
    for k in range(5, 9):
        ctl.observe_step(k, 1.2)  # noise, or the probed server is slow: its speed says
    # No rollback: the next decision uses the probed server's measured speed instead.
    again = ctl.decide(8, sizes, probe, [100.0, 100.0, 10.0])
    assert ctl.rollbacks == 0
    assert again is not None and again.count(2) == 0


def test_after_a_rollback_plans_move_half_as_many_chunks() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3, min_gain=0.0)
    sizes, owners = [100] * 8, [0] * 4 + [1] * 4
    speeds = [100.0, 20.0]  # server 1 looks 5x slower: the plan moves 3 of its chunks
    for k in range(5):
        ctl.observe_step(k, 1.0)
    tried = ctl.decide(4, sizes, owners, speeds)
    assert tried is not None
    moved = sum(a != b for a, b in zip(owners, tried, strict=True))
    assert moved >= 2
    for k in range(5, 8):
        ctl.observe_step(k, 1.5)
    assert ctl.decide(7, sizes, tried, speeds) == tuple(owners)  # rolled back
    for k in range(8, 12):
        ctl.observe_step(k, 1.0)
    smaller = ctl.decide(9, sizes, owners, speeds)
    assert smaller is not None
    assert 1 <= sum(a != b for a, b in zip(owners, smaller, strict=True)) <= moved // 2


def test_a_new_slowest_server_gets_whole_plans_again() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3, min_gain=0.0)
    sizes, owners = [100] * 12, [0] * 4 + [1] * 4 + [2] * 4
    speeds = [100.0, 20.0, 100.0]
    for k in range(5):
        ctl.observe_step(k, 1.0)
    tried = ctl.decide(4, sizes, owners, speeds)
    assert tried is not None
    for k in range(5, 8):
        ctl.observe_step(k, 1.5)
    assert ctl.decide(7, sizes, tried, speeds) == tuple(owners)  # rolled back: halved
    for k in range(8, 12):
        ctl.observe_step(k, 1.0)
    # The straggler moved: server 0 is now the slowest, server 1 fast again. Its plan
    # is not held to the halved size that was meant for server 1's.
    moved_now = ctl.decide(9, sizes, owners, [20.0, 100.0, 100.0])
    whole = rebalance(sizes, owners, [20.0, 100.0, 100.0])
    assert moved_now == whole.owners
    assert sum(a != b for a, b in zip(owners, moved_now, strict=True)) >= 2


def test_a_plan_is_not_rolled_back_for_a_slowdown_the_speeds_blame_elsewhere() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3, min_gain=0.0)
    sizes, owners = [100] * 12, [0] * 4 + [1] * 4 + [2] * 4
    for k in range(5):
        ctl.observe_step(k, 1.0)
    tried = ctl.decide(4, sizes, owners, [100.0, 50.0, 100.0])  # off server 1
    assert tried is not None and tried.count(1) < 4
    for k in range(5, 8):
        ctl.observe_step(k, 2.0)  # slower: but server 1 has since slowed further
    assert ctl.decide(7, sizes, tried, [100.0, 40.0, 100.0]) is None
    assert ctl.rollbacks == 0


def test_a_lightly_loaded_server_is_filled_to_the_median_load_at_most() -> None:
    # Server 0 owns one chunk, measured (on that light load) 5x faster than the rest:
    # taken at its word it would receive most of server 3's chunks at once.
    sizes, owners = [100] * 13, [0] + [1] * 4 + [2] * 4 + [3] * 4
    speeds = [500.0, 100.0, 100.0, 10.0]
    plan = rebalance(sizes, owners, speeds)
    assert plan.owners.count(0) == 4  # up to the median load of the loaded servers
    assert plan.owners.count(3) < 4
    # Once it carries the median its figure is trusted: more may follow.
    again = rebalance(sizes, plan.owners, speeds)
    assert again.owners.count(0) > plan.owners.count(0)


def test_a_straggler_arriving_during_a_trial_is_answered_without_waiting_it_out() -> None:
    sizes, owners = [100] * 16, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    speeds = [100.0, 50.0, 100.0, 100.0]

    def start() -> tuple[PsldController, tuple[int, ...], set[int]]:
        ctl = PsldController(confirm=1, interval=1, horizon=1000, window=5, min_gain=0.0)
        for k in range(5):
            ctl.observe_step(k, 1.0)
        tried = ctl.decide(4, sizes, owners, speeds)  # off server 1
        assert tried is not None
        ctl.observe_step(5, 3.0)
        return ctl, tried, {o for o, was in zip(tried, owners, strict=True) if o != was}

    ctl, tried, receivers = start()
    bystander = next(s for s in (0, 2, 3) if s not in receivers)
    slowed = list(speeds)
    slowed[bystander] = 10.0  # one step into the trial, a server given nothing slows
    now = ctl.decide(6, sizes, tried, slowed)
    assert now is not None and now.count(bystander) < tried.count(bystander)
    assert ctl.rollbacks == 0
    # A receiver found slower is no such case: the trial runs its course.
    ctl, tried, receivers = start()
    slowed = list(speeds)
    slowed[min(receivers)] = 10.0
    assert ctl.decide(6, sizes, tried, slowed) is None


def test_workers_figures_correct_a_stale_or_blind_server_figure() -> None:
    est = SpeedEstimator(keep=3, min_busy_s=0.01)
    for server in range(4):
        est.observe(server, 0.0, 0.0)
        for window in range(1, 4):
            est.observe(server, 0.1 * window, 1e7 * window)  # 100 MB/s by busy time
    est.observe(3, 0.4, 0.4e8)
    # Server 3's windows said 100 MB/s until it slowed down to 20 MB/s.
    assert est.speeds(4) == [pytest.approx(1e8)] * 4
    est.observe_step(0, 9e6, 0.1, 0.08)  # 90 to 112 MB/s: agrees, the busy figure stands
    est.observe_step(1, 6e6, 0.1, 0.08)  # 60 to 75: within 2x, still the busy figure
    est.observe_step(2, 9e6, 0.03, 0.0)  # a lower bound of 300: the figure is stale
    est.observe_step(3, 2e6, 0.1, 0.1)  # at most 20 MB/s: slower than its busy time says
    assert est.speeds(4) == [
        pytest.approx(1e8),
        pytest.approx(1e8),
        pytest.approx(3e8),
        pytest.approx(2e7),
    ]
    assert est.observed(2) == (pytest.approx(3e8), float("inf"))


def test_a_plan_made_on_a_fresh_slowdown_is_judged_against_the_slow_step() -> None:
    # The workers' figures show a straggler one step after it slowed: the window's
    # median still holds the fast steps before it, which no map can match any more.
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=5, min_gain=0.0)
    sizes, owners = [100] * 12, [0] * 4 + [1] * 4 + [2] * 4
    for k in range(5):
        ctl.observe_step(k, 1.0)
    ctl.observe_step(5, 3.0)
    tried = ctl.decide(5, sizes, owners, [100.0, 25.0, 100.0])
    assert tried is not None and tried.count(1) < 4
    for k in range(6, 11):
        ctl.observe_step(k, 1.3)  # slower than before the straggler, far faster than with it
    assert ctl.decide(10, sizes, tried, [100.0, 25.0, 100.0]) is None
    assert ctl.rollbacks == 0


def test_explore_moves_one_chunk_to_the_least_loaded_server_when_the_model_allows() -> None:
    # 31 chunks on 3 fast servers, one on the slow one: giving it a second is predicted
    # 1% slower at its measured 18 (within the model's error), 2x slower at 10.
    sizes = [10] * 32
    owners = [0] * 11 + [1] * 10 + [2] * 10 + [3]
    tried = explore_move(sizes, owners, [100.0, 100.0, 100.0, 18.0])
    assert tried is not None
    assert [tried.count(s) for s in range(4)] == [10, 10, 10, 2]
    assert explore_move(sizes, owners, [100.0, 100.0, 100.0, 10.0]) is None
    # Without the slow server (drained), every server carries the median load or more:
    # all figures were measured under load, there is nothing to explore.
    assert explore_move(sizes, owners, [100.0] * 3 + [18.0], active=[True] * 3 + [False]) is None


def test_an_exploratory_move_is_kept_only_if_the_step_got_faster() -> None:
    sizes = [10] * 32
    owners = tuple([0] * 11 + [1] * 10 + [2] * 10 + [3])
    speeds = [100.0, 100.0, 100.0, 18.0]

    def quiet(ctl: PsldController, until: int) -> tuple[int, ...] | None:
        tried = None
        for k in range(until + 1):
            ctl.observe_step(k, 1.0)
            tried = ctl.decide(k, sizes, owners, speeds) or tried
        return tried

    # (min_servers=4: at the job's starting count, one fewer server is not an option.)
    ctl = PsldController(confirm=1, interval=1, window=3, explore_every=10, min_servers=4)
    tried = quiet(ctl, 10)
    assert tried is not None and tried.count(3) == 2 and ctl.explorations == 1
    for k in range(11, 14):
        ctl.observe_step(k, 0.9)  # faster: kept
    assert ctl.decide(13, sizes, tried, speeds) is None and ctl.rollbacks == 0

    ctl = PsldController(confirm=1, interval=1, window=3, explore_every=10, min_servers=4)
    tried = quiet(ctl, 10)
    assert tried is not None
    for k in range(11, 14):
        ctl.observe_step(k, 1.0)  # no faster: undone, and not tried again at once
    assert ctl.decide(13, sizes, tried, speeds) == owners and ctl.rollbacks == 1
    for k in range(14, 24):
        ctl.observe_step(k, 1.0)
        assert ctl.decide(k, sizes, owners, speeds) is None  # quiet again, the map banned
    # An exploration's rollback does not halve later plans (it was no plan's overshoot).
    assert ctl._max_moves is None


def test_a_server_near_the_median_load_is_not_held_to_it() -> None:
    # 9 chunks against a median of 9.5 is a load measured under load: the trust cap (for
    # servers measured on a light load) must not keep the 11-chunk server as it is.
    sizes = [10] * 32
    owners = [0] * 9 + [1] * 11 + [2] * 10 + [3] * 2
    plan = rebalance(sizes, owners, [100.0, 98.0, 99.0, 26.0])
    assert [plan.owners.count(s) for s in range(4)] == [10, 10, 10, 2]


def test_no_plan_or_exploration_saves_less_than_the_absolute_floor() -> None:
    # A small model: the slowest server needs 0.5 ms a step; halving it is "50%" but
    # 0.25 ms, within the noise of any figure at that scale.
    sizes, owners = [1000] * 4, [0, 0, 0, 1]
    speeds = [6e6, 6e6]
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3, explore_every=5)
    for k in range(12):
        ctl.observe_step(k, 0.01)
        assert ctl.decide(k, sizes, owners, speeds) is None
    assert ctl.explorations == 0
    fast = PsldController(confirm=1, interval=1, horizon=1000, window=3, min_gain_s=0.0)
    fast.observe_step(0, 0.01)
    assert fast.decide(1, sizes, owners, speeds) is not None


def test_one_fewer_server_is_tried_when_the_others_can_carry_its_load() -> None:
    # 30 chunks; server 3 runs at an eighth of the others' speed and carries 1 chunk
    # (0.83 s against their 1 s): without it the slowest time stays 1 s.
    sizes = [10] * 30
    owners = [0] * 10 + [1] * 10 + [2] * 9 + [3]
    speeds = [100.0, 100.0, 100.0, 12.0]
    tried = drain_move(sizes, owners, speeds)
    assert tried is not None and 3 not in tried and len(tried) == 30
    assert max(server_times(sizes, tried, speeds)) <= 1.05 * max(
        server_times(sizes, owners, speeds)
    )
    # At half the others' speed, server 3 carries a real share: not without it.
    balanced = [0] * 8 + [1] * 8 + [2] * 8 + [3] * 4 + [0, 1]
    assert drain_move([10] * 30, balanced, [100.0, 100.0, 100.0, 50.0]) is None
    # One active server (the other draining): nothing to try.
    assert drain_move(sizes, owners, speeds, active=[True, False, False, False]) is None


def _quiet(ctl: PsldController, sizes, owners, speeds, until: int, start: int = 0):
    tried = None
    for k in range(start, until + 1):
        ctl.observe_step(k, 1.0)
        tried = ctl.decide(k, sizes, owners, speeds) or tried
    return tried


def test_one_fewer_server_is_kept_if_no_slower_and_rolled_back_if_slower() -> None:
    sizes = [10] * 30
    owners = tuple([0] * 10 + [1] * 10 + [2] * 9 + [3])
    speeds = [100.0, 100.0, 100.0, 12.0]  # no plan helps (server 3 is not the slowest)

    ctl = PsldController(confirm=1, interval=1, window=3, explore_every=10, min_servers=3)
    tried = _quiet(ctl, sizes, owners, speeds, 10)
    assert tried is not None and 3 not in tried and ctl.drains == 1
    for k in range(11, 14):
        ctl.observe_step(k, 1.02)  # within the tolerance: kept (the server is freed)
    assert ctl.decide(13, sizes, tried, speeds) is None and ctl.rollbacks == 0

    ctl = PsldController(confirm=1, interval=1, window=3, explore_every=10, min_servers=3)
    tried = _quiet(ctl, sizes, owners, speeds, 10)
    assert tried is not None
    for k in range(11, 14):
        ctl.observe_step(k, 1.2)  # slower: undone
    assert ctl.decide(13, sizes, tried, speeds) == owners and ctl.rollbacks == 1

    # At the job's starting count, no server is given back: a chunk is explored instead.
    ctl = PsldController(confirm=1, interval=1, window=3, explore_every=10, min_servers=4)
    _quiet(ctl, sizes, owners, speeds, 10)
    assert ctl.drains == 0


def test_only_a_lasting_straggler_left_with_nothing_retires() -> None:
    ctl = StragglerScaling(idle_steps=3, min_servers=2)
    active = [True, True, True]
    emptied = (0, 0, 2, 2)  # server 1 gave everything away at clock 10
    lasting = frozenset({1})
    for k in range(10, 13):
        assert ctl.idle_server(k, emptied, active, lasting) is None  # not for 3 steps yet
    assert ctl.idle_server(13, emptied, active, frozenset()) is None  # may be passing
    assert ctl.idle_server(13, emptied, active, lasting) == 1
    # Not while a trial runs, nor at the job's starting count of servers.
    assert ctl.idle_server(14, emptied, active, lasting, settled=False) is None
    assert ctl.idle_server(14, emptied, [True, False, True], frozenset({2})) is None
    # Given a chunk again (a re-measurement), its idle count starts over.
    assert ctl.idle_server(15, (0, 1, 2, 2), active, lasting) is None
    assert ctl.idle_server(16, emptied, active, lasting) is None


def test_one_more_server_is_wanted_while_an_active_one_straggles() -> None:
    scaling = SCALING.create("stragglers")
    assert not scaling.wants_server(None, [True, True])  # nothing measured yet
    assert not scaling.wants_server([100.0, 10.0], [True, False])  # one active: no median
    assert scaling.wants_server([100.0, 100.0, 40.0], [True, True, True])
    assert not scaling.wants_server([100.0, 100.0, 60.0], [True, True, True])
    # A draining straggler does not count: its load is leaving already.
    assert not scaling.wants_server([100.0, 100.0, 40.0], [True, True, False])


def test_a_trial_in_flight_is_visible_to_the_scaling_policy() -> None:
    ctl = PsldController(confirm=1, interval=1, horizon=1000, window=3)
    sizes, owners = [100, 100, 100, 100], [0, 0, 1, 1]
    for k in range(5):
        ctl.observe_step(k, 1.0)
    assert not ctl.trial_running
    assert ctl.decide(4, sizes, owners, [100.0, 40.0]) is not None
    assert ctl.trial_running


def test_a_plan_reaches_its_loads_in_the_fewest_moves_whichever_way_it_was_found() -> None:
    # Issue 38's bed: 32 chunks round robin on 4 servers, server 1 slow. The greedy
    # search moved chunks onto server 0 until it was the slowest, then two of server
    # 0's own to server 3: 8 moves where 6 give every server the same load. The plan
    # now depends on the loads reached, not on the path: slow figures 4 and 4.7 times
    # below the others' (7 and 8 greedy moves before) give the same 6 moves.
    sizes, owners = [100] * 32, [0, 1, 2, 3] * 8
    plans = [rebalance(sizes, owners, [143.6, v, 143.6, 143.6]) for v in (30.5, 36.0)]
    assert plans[0].owners == plans[1].owners
    pairs = enumerate(zip(owners, plans[0].owners, strict=True))
    moves = [(c, a, b) for c, (a, b) in pairs if a != b]
    assert moves == [(1, 1, 0), (5, 1, 0), (9, 1, 2), (13, 1, 2), (17, 1, 3), (21, 1, 3)]
    assert plans[0].moved_bytes == 600
    # Per size: a server gives its lowest-numbered chunks of a size, the takers in order.
    assert fewest_moves([1, 2, 1, 2], [0, 0, 0, 0], [0, 1, 1, 0]) == (1, 1, 0, 0)
    assert fewest_moves([1, 1], [0, 1], [1, 0]) == (0, 1)  # a swap of equals: none
