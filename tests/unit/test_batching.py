"""Batch-sizing policies (LB-BSP): equal finish times, bounds, predictors, convergence."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from trimtab import ConfigError
from trimtab.data import equal_split
from trimtab.policies.batching import (
    BATCHING,
    PREDICTORS,
    LbBsp,
    LbBspGpu,
    MovingAverage,
    NarxPredictor,
    SpeedPredictor,
    WorkerSample,
    equal_finish_sizes,
)


def sample(
    rank: int, batch: int, compute_s: float, comm_s: float = 0.0, cpu: float = 1.0
) -> WorkerSample:
    return WorkerSample(rank, batch, compute_s, comm_s, cpu)


def bsp_step(
    sizes: dict[int, int], time_of: dict[int, float], comm: float
) -> dict[int, WorkerSample]:
    """One BSP step's samples: every worker waits for the slowest, inside its comm_s."""
    end = max(time_of[r] + comm for r in sizes)
    return {r: sample(r, sizes[r], time_of[r], end - time_of[r]) for r in sizes}


# -- equal_finish_sizes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("speeds", "comm", "total"),
    [
        ([100.0, 250.0, 40.0, 700.0], [0.01, 0.05, 0.0, 0.2], 1000),
        ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], 10),
        ([3.3, 7.1], [0.4, 0.0], 97),
        ([1e4, 1.0, 55.5, 300.0, 2.0], [0.0, 0.0, 0.003, 0.1, 0.0], 12345),
    ],
)
def test_sizes_sum_exactly_and_finish_together_within_rounding(
    speeds: list[float], comm: list[float], total: int
) -> None:
    sizes = equal_finish_sizes(speeds, comm, total)
    assert sum(sizes) == total
    assert all(isinstance(b, int) and b >= 1 for b in sizes)
    # The paper's closed form, where no worker is held at a bound.
    finish = (total + sum(v * c for v, c in zip(speeds, comm, strict=True))) / sum(speeds)
    if all(v * (finish - c) >= 1 for v, c in zip(speeds, comm, strict=True)):
        for b, v, c in zip(sizes, speeds, comm, strict=True):
            assert abs(b / v + c - finish) <= 1 / v + 1e-9  # one sample's worth at most


def test_equal_speeds_give_data_equal_split() -> None:
    assert equal_finish_sizes([2.0] * 3, [0.1] * 3, 11) == equal_split(11, 3) == [4, 4, 3]


def test_a_worker_three_times_slower_gets_a_third_of_a_fast_share() -> None:
    assert equal_finish_sizes([300.0, 300.0, 100.0], [0.0] * 3, 700) == [300, 300, 100]
    sizes = equal_finish_sizes([3.0, 1.0], [0.05, 0.05], 1001)
    assert abs(sizes[1] - sizes[0] / 3) <= 1


def test_comm_time_costs_batch() -> None:
    # Equal speeds, but worker 1 spends 1 s more communicating: 100 samples fewer.
    assert equal_finish_sizes([100.0, 100.0], [0.0, 1.0], 300) == [200, 100]


def test_caps_hold_and_the_rest_is_shared_by_speed() -> None:
    # Unbounded, worker 0 would take ~292 of 300; capped at 50, the other 250 go 1:3.
    sizes = equal_finish_sizes([1000.0, 10.0, 30.0], [0.0] * 3, 300, caps=[50, 1000, 1000])
    assert sizes[0] == 50
    assert sum(sizes) == 300
    assert abs(sizes[2] - 3 * sizes[1]) <= 3
    assert sizes[1:] in ([62, 188], [63, 187])


def test_min_batch_holds_and_what_it_takes_comes_from_the_others() -> None:
    assert equal_finish_sizes([1.0, 1000.0], [0.0, 0.0], 100, min_batch=10) == [10, 90]
    # Worker 0's comm alone exceeds the others' finish time: it still gets min_batch.
    sizes = equal_finish_sizes([10.0, 10.0, 30.0], [50.0, 0.0, 0.0], 81, min_batch=5)
    assert sizes == [5, 19, 57]


def test_caps_and_floor_together() -> None:
    sizes = equal_finish_sizes(
        [1.0, 50.0, 50.0, 100.0], [0.0] * 4, 400, min_batch=20, caps=[400, 400, 400, 150]
    )
    assert sizes == [20, 115, 115, 150]


@pytest.mark.parametrize(
    ("speeds", "comm", "total", "kwargs", "match"),
    [
        ([1.0, 1.0], [0.0, 0.0], 1, {}, "min_batch"),
        ([1.0, 1.0], [0.0, 0.0], 10, {"min_batch": 6}, "min_batch"),
        ([1.0, 1.0], [0.0, 0.0], 10, {"min_batch": 0}, "min_batch"),
        ([1.0, 1.0], [0.0, 0.0], 10, {"caps": [4, 5]}, "caps"),
        ([1.0, 1.0], [0.0, 0.0], 10, {"caps": [10]}, "caps"),
        ([1.0, 1.0], [0.0, 0.0], 10, {"caps": [10, 1], "min_batch": 2}, "caps"),
        ([1.0, 0.0], [0.0, 0.0], 10, {}, "speed"),
        ([1.0, -2.0], [0.0, 0.0], 10, {}, "speed"),
        ([1.0, math.nan], [0.0, 0.0], 10, {}, "speed"),
        ([1.0, math.inf], [0.0, 0.0], 10, {}, "speed"),
        ([1.0, 1.0], [0.0, -0.1], 10, {}, "comm"),
        ([1.0, 1.0], [0.0], 10, {}, "comm"),
        ([], [], 10, {}, "no workers"),
    ],
)
def test_bad_inputs_raise_config_error(
    speeds: list[float], comm: list[float], total: int, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        equal_finish_sizes(speeds, comm, total, **kwargs)


def test_bad_policy_settings_and_samples_are_refused() -> None:
    with pytest.raises(ConfigError, match="choose one of"):
        LbBsp("oracle")
    with pytest.raises(ConfigError):
        LbBsp(comm_window=0)
    with pytest.raises(ConfigError):
        LbBspGpu(growth=2.0)
    with pytest.raises(ConfigError):
        MovingAverage(window=0)
    with pytest.raises(ConfigError):
        NarxPredictor(window=6)  # below p + q + 3
    with pytest.raises(ConfigError, match="caps"):
        LbBsp(caps={0: 3, 1: 3}).batch_sizes({0: [], 1: []}, 10)
    with pytest.raises(ConfigError, match="min_batch"):
        LbBspGpu(min_batch=4).batch_sizes({0: [], 1: []}, 7)
    with pytest.raises(ConfigError, match="no workers"):
        BATCHING.create("equal").batch_sizes({}, 8)
    with pytest.raises(ValueError, match="another rank"):
        LbBsp().batch_sizes({0: [sample(1, 4, 1.0)], 1: []}, 8)
    for bad in [(0, 0, 1.0, 0.0, 1.0), (0, 4, 0.0, 0.0, 1.0), (0, 4, 1.0, -1.0, 1.0)]:
        with pytest.raises(ValueError):
            WorkerSample(*bad)
    with pytest.raises(ValueError):
        WorkerSample(0, 4, 1.0, math.nan, 1.0)
    for predictor in (MovingAverage(), NarxPredictor()):
        with pytest.raises(ValueError, match="empty"):
            predictor.predict([])


# -- registry and policies -----------------------------------------------------------


def test_registry_names_and_unknown_name() -> None:
    assert BATCHING.names() == ["equal", "lbbsp", "lbbsp-gpu"]
    assert PREDICTORS.names() == ["average", "narx"]
    # Only equal sizes ignore the measurements (workers then need not wait for sizes).
    assert [n for n in BATCHING.names() if not BATCHING.create(n).adaptive] == ["equal"]
    with pytest.raises(ConfigError, match="choose one of"):
        BATCHING.create("lbbsp-tpu")
    policy = BATCHING.create("lbbsp", predictor="average", min_batch=2)
    assert isinstance(policy, LbBsp) and isinstance(policy.predictor, MovingAverage)
    assert all(BATCHING.create(name).name == name for name in BATCHING.names())


@pytest.mark.parametrize("name", ["equal", "lbbsp", "lbbsp-gpu"])
def test_empty_history_gives_equal_sizes(name: str) -> None:
    policy = BATCHING.create(name)
    assert policy.batch_sizes({5: [], 2: [], 9: []}, 10) == {2: 4, 5: 3, 9: 3}
    assert policy.batch_sizes({0: [], 1: []}, 64) == {0: 32, 1: 32}


def test_equal_ignores_speeds() -> None:
    history = {0: [sample(0, 8, 1.0)], 1: [sample(1, 8, 9.0)]}
    assert BATCHING.create("equal").batch_sizes(history, 17) == {0: 9, 1: 8}


@pytest.mark.parametrize("predictor", ["average", "narx"])
def test_lbbsp_balances_despite_bsp_waits_in_comm_s(predictor: str) -> None:
    # Worker 1 is 3x faster; in BSP its comm_s includes waiting for worker 0. Taking
    # that wait for communication would leave the sizes equal forever.
    speed, comm = {0: 100.0, 1: 300.0}, 0.05
    policy = LbBsp(predictor)
    history: dict[int, list[WorkerSample]] = {0: [], 1: []}
    for _ in range(8):
        sizes = policy.batch_sizes(history, 400)
        assert sum(sizes.values()) == 400
        step = bsp_step(sizes, {r: sizes[r] / speed[r] for r in sizes}, comm)
        for r, s in step.items():
            history[r].append(s)
    assert sizes == {0: 100, 1: 300}


def test_lbbsp_charges_each_worker_its_own_communication_time() -> None:
    # Same compute speed (100/s); worker 1's communication takes 1 s longer: 100 fewer.
    history = {0: [sample(0, 150, 1.5, 0.2)], 1: [sample(1, 150, 1.5, 1.2)]}
    assert LbBsp("average").batch_sizes(history, 300) == {0: 200, 1: 100}
    # The least over the last comm_window steps counts, so a one-off stall is forgotten.
    history[0].append(sample(0, 150, 1.5, 5.0))
    history[1].append(sample(1, 150, 1.5, 1.2))
    assert LbBsp("average").batch_sizes(history, 300) == {0: 200, 1: 100}
    assert LbBsp("average", comm_window=1).batch_sizes(history, 300) == {0: 1, 1: 299}


def test_lbbsp_respects_caps_min_batch_and_gives_a_new_worker_the_mean_speed() -> None:
    history = {
        0: [sample(0, 100, 1.0)] * 3,  # 100/s
        1: [sample(1, 100, 0.1)] * 3,  # 1000/s
        2: [],  # just joined: taken as the mean, 550/s
    }
    sizes = LbBsp("average").batch_sizes(history, 1650)
    assert sizes == {0: 100, 1: 1000, 2: 550}
    capped = LbBsp("average", caps={1: 600}, min_batch=200).batch_sizes(history, 1650)
    assert capped[1] == 600 and capped[0] == 200 and sum(capped.values()) == 1650


# -- predictors ----------------------------------------------------------------------


def switching_series(steps: int, seed: int) -> list[WorkerSample]:
    """speed = 1000 * cpu_share + noise; cpu_share switches 1.0 <-> 0.3 every 5 steps."""
    rng = random.Random(seed)
    out = []
    for t in range(steps):
        share = 1.0 if (t // 5) % 2 == 0 else 0.3
        speed = 1000 * share + rng.gauss(0, 20)
        out.append(WorkerSample(0, 100, 100 / speed, 0.0, share))
    return out


def mean_abs_error(predict_from: Sequence[WorkerSample], model: SpeedPredictor) -> float:
    errors = [
        abs(model.predict(predict_from[:t]) - predict_from[t].speed)
        for t in range(25, len(predict_from))
    ]
    return sum(errors) / len(errors)


def test_narx_tracks_a_speed_that_follows_cpu_share_better_than_the_average() -> None:
    for seed in range(3):
        series = switching_series(100, seed)
        narx = mean_abs_error(series, NarxPredictor())
        average = mean_abs_error(series, MovingAverage())
        assert narx < 0.7 * average, (seed, narx, average)


def test_narx_uses_cpu_share_when_it_announces_the_next_speed() -> None:
    # cpu_share at the end of step t (random) sets the speed of step t+1: only a model
    # that reads the exogenous input can predict it; past speeds say nothing.
    rng = random.Random(7)
    series, share = [], 1.0
    for _ in range(100):
        speed, share = 1000 * share + rng.gauss(0, 20), rng.choice([0.3, 1.0])
        series.append(WorkerSample(0, 100, 100 / speed, 0.0, share))
    narx = mean_abs_error(series, NarxPredictor())
    assert narx < 0.25 * mean_abs_error(series, MovingAverage())
    assert narx < 0.25 * mean_abs_error(series, NarxPredictor(q=0))


def test_narx_falls_back_to_the_average_then_fits_and_clamps() -> None:
    series = switching_series(30, 0)
    assert NarxPredictor().predict(series[:6]) == MovingAverage().predict(series[:6])
    assert NarxPredictor().predict(series[:7]) != MovingAverage().predict(series[:7])
    steady = [sample(0, 100, 0.25)] * 12
    assert NarxPredictor().predict(steady) == pytest.approx(400.0)
    # A wild history: whatever the fit says, the answer stays within [0.25x, 4x] of last.
    wild = [sample(0, 100, 100 / v, cpu=c) for v, c in [(1, 1.0), (1e5, 0.0)] * 6]
    wild.append(sample(0, 100, 1.0, cpu=1.0))
    for model in (NarxPredictor(ridge=0.0), NarxPredictor()):
        assert 25.0 <= model.predict(wild) <= 400.0
    assert MovingAverage(window=2).predict(series[:4]) == pytest.approx(
        (series[2].speed + series[3].speed) / 2
    )


# -- the GPU algorithm ---------------------------------------------------------------


def run_gpu(
    policy: LbBspGpu,
    speeds: list[float],
    calls: int,
    total: int = 1024,
    change: tuple[int, list[float]] | None = None,
) -> tuple[list[dict[int, int]], list[float]]:
    """Drive the policy against t_i(b) = 0.05 + b / v_i + 2e-5 b^2, BSP-style; at call
    ``change[0]`` the speeds become ``change[1]``. Returns the sizes of every call and
    the finish times of the last."""
    history: dict[int, list[WorkerSample]] = {r: [] for r in range(len(speeds))}
    chosen: list[dict[int, int]] = []
    finish: list[float] = []
    for call in range(calls):
        if change is not None and call == change[0]:
            speeds = change[1]
        sizes = policy.batch_sizes(history, total)
        chosen.append(sizes)
        compute = {r: b / speeds[r] + 2e-5 * b * b for r, b in sizes.items()}
        finish = [0.05 + compute[r] for r in sorted(sizes)]
        for r, s in bsp_step(sizes, compute, 0.05).items():
            history[r].append(s)
    return chosen, finish


def test_gpu_converges_to_equal_finish_without_exceeding_caps() -> None:
    policy = LbBspGpu(caps={3: 330})
    chosen, finish = run_gpu(policy, [100.0, 200.0, 400.0, 800.0], calls=30)
    assert all(sum(s.values()) == 1024 for s in chosen)
    assert max(s[3] for s in chosen) == 330  # the cap was reached, and never passed
    assert (max(finish) - min(finish)) / min(finish) < 0.05
    assert chosen[-1][0] < chosen[-1][1] < chosen[-1][2] < chosen[-1][3]


def test_gpu_with_a_binding_cap_balances_the_others() -> None:
    chosen, finish = run_gpu(LbBspGpu(caps={3: 250}), [100.0, 200.0, 400.0, 800.0], 30)
    assert chosen[-1][3] == 250
    free = finish[:3]
    assert (max(free) - min(free)) / min(free) < 0.05


def test_gpu_halves_its_step_on_reversal_and_recovers_after_a_drift() -> None:
    policy = LbBspGpu()
    speeds, slowed = [100.0, 200.0, 400.0, 800.0], [100.0, 200.0, 400.0, 200.0]
    chosen, finish = run_gpu(policy, speeds, calls=60, change=(30, slowed))
    assert chosen[29][3] > chosen[29][2]
    # Worker 3 slowed down 4x at call 30 (interference): the policy must re-balance.
    assert chosen[-1][3] < chosen[-1][2]
    assert (max(finish) - min(finish)) / min(finish) < 0.05
    assert min(policy._step.values()) < 1.0  # some worker overshot and halved its step


def test_gpu_moves_nothing_within_tolerance() -> None:
    history = {0: [sample(0, 500, 1.0)], 1: [sample(1, 500, 1.008)]}  # 0.4% off the mean
    assert LbBspGpu().batch_sizes(history, 1000) == {0: 500, 1: 500}
    assert LbBspGpu(tolerance=0.0).batch_sizes(history, 1000) == {0: 502, 1: 498}


def test_gpu_forgets_a_departed_rank_and_restarts_when_one_joins() -> None:
    policy = LbBspGpu()
    run_gpu(policy, [100.0, 300.0], calls=5, total=400)
    assert set(policy._step) == {0, 1}
    policy.batch_sizes({0: [sample(0, 200, 2.0)], 2: [sample(2, 200, 1.0)]}, 400)
    assert set(policy._step) == {0, 2}
    joined = {0: [sample(0, 100, 1.0)], 2: [sample(2, 300, 1.0)], 3: []}
    assert policy.batch_sizes(joined, 400) == {0: 134, 2: 133, 3: 133}
    assert policy._step == {}


def test_lbbsp_keeps_sizes_while_predicted_finish_times_agree() -> None:
    from trimtab.policies.batching import BATCHING, WorkerSample

    policy = BATCHING.create("lbbsp", predictor="average")

    def hist(batches: list[int], speeds: list[float]) -> dict[int, list[WorkerSample]]:
        return {
            r: [WorkerSample(r, b, b / v, 0.01, 1.0)] * 3
            for r, (b, v) in enumerate(zip(batches, speeds, strict=True))
        }

    # 3% apart: within the 5% tolerance, the odd split stays
    assert policy.batch_sizes(hist([33, 31], [1030.0, 1000.0]), 64) == {0: 33, 1: 31}
    # 2x apart: re-split toward equal finish times
    moved = policy.batch_sizes(hist([32, 32], [2000.0, 1000.0]), 64)
    assert moved[0] > 40 and sum(moved.values()) == 64
