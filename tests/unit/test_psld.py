"""The PSLD policies: best-fit rebalancing, cost-awareness, rollback, speed estimates."""

from __future__ import annotations

import pytest

from trimtab._psld import PsldController, SpeedEstimator, rebalance, server_times


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


def test_controller_waits_for_a_plan_worth_its_cost() -> None:
    sizes, owners = [100, 100, 100, 100], [0, 0, 1, 1]
    cheap = PsldController(interval=1, horizon=50)
    # Server 1 twice as slow: moving a chunk saves 1 s a step for 50 steps, costs ~15 s.
    assert cheap.decide(1, sizes, owners, [100.0, 50.0]) is not None
    short = PsldController(interval=1, horizon=2)  # 2 steps of gain never repay it
    assert short.decide(1, sizes, owners, [100.0, 50.0]) is None
    assert PsldController(interval=1).decide(1, sizes, owners, None) is None  # no data yet


def test_controller_rolls_back_a_plan_that_made_steps_slower() -> None:
    ctl = PsldController(interval=1, horizon=1000, window=3)
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
    ctl = PsldController(interval=1, horizon=1000, window=3)
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
