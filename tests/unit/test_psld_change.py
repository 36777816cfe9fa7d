"""PSLD's change test on a server's latest speed windows (issue 20: react to a server
that slows down within 2 steps, and never to noise alone). Synthetic windows, one a
step, with seeded noise."""

from __future__ import annotations

import random

import pytest

from trimtab.policies.psld import SpeedEstimator
from trimtab.policies.psld.change import ChangeSettings, LevelTracker

FAST = 1e8  # bytes per busy second


def noisy(rng: random.Random, level: float, sd: float = 0.15) -> float:
    """A window of a server at ``level``, with log-normal noise of ``sd``."""
    return level * rng.lognormvariate(0.0, sd)


@pytest.mark.parametrize("slowdown", [2.0, 4.0, 20.0])
@pytest.mark.parametrize("seed", range(5))
def test_a_step_change_is_detected_within_two_steps(slowdown: float, seed: int) -> None:
    rng = random.Random(seed)
    level = LevelTracker()
    for _ in range(30):
        assert not level.observe(noisy(rng, FAST, 0.1))
    slow = FAST / slowdown
    seen = [level.observe(noisy(rng, slow, 0.1)) for _ in range(2)]
    assert seen == [False, True]  # the first slow window alone could be noise
    figure = level.figure()
    assert figure is not None and slow / 1.5 < figure < slow * 1.5
    # ... and, once the new level has its windows, a recovery the same way.
    for _ in range(5):
        assert not level.observe(noisy(rng, slow, 0.1))
    back = [level.observe(noisy(rng, FAST, 0.1)) for _ in range(2)]
    assert back == [False, True] and level.changes == 2


def test_a_median_of_five_needed_three_slow_windows() -> None:
    # What the change test replaces, for the record: the median of the last five
    # windows follows a 1.8x slowdown only at its third window.
    windows = [FAST] * 5
    figures = []
    for _ in range(3):
        windows = [*windows[1:], FAST / 1.8]
        figures.append(sorted(windows)[2])
    assert figures == [FAST, FAST, FAST / 1.8]


@pytest.mark.parametrize("sd", [0.05, 0.15, 0.25])
@pytest.mark.parametrize("seed", range(3))
def test_noise_alone_never_makes_a_change(sd: float, seed: int) -> None:
    rng = random.Random(seed)
    level = LevelTracker()
    for _ in range(3000):
        level.observe(noisy(rng, FAST, sd))
    assert level.changes == 0
    figure = level.figure()
    assert figure is not None and FAST / 1.3 < figure < FAST * 1.3


def test_one_wild_window_is_neither_a_change_nor_part_of_the_level() -> None:
    level = LevelTracker()
    for _ in range(5):
        level.observe(FAST)
    assert not level.observe(FAST * 1000)  # a burst
    assert not level.observe(FAST / 1000)  # a pause: out on the other side, not a pair
    assert not level.observe(FAST)
    assert level.figure() == FAST and level.changes == 0


def test_the_change_test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="history"):
        ChangeSettings(keep=2, history=3)
    with pytest.raises(ValueError, match="thresholds"):
        ChangeSettings(confirm=5, history=5)
    with pytest.raises(ValueError, match="thresholds"):
        ChangeSettings(min_ratio=1.0)


def test_the_estimator_sees_a_server_slow_down_by_its_second_window() -> None:
    # Server counters as the servers send them (cumulative busy seconds and bytes), one
    # report a step: server 1 handles its bytes 1.8x slower from step 20, less than the
    # workers' figures alone would correct (they need a factor of 2).
    rng = random.Random(3)
    est = SpeedEstimator()
    busy = [0.0, 0.0]
    nbytes = [0.0, 0.0]
    for server in range(2):
        est.observe(server, 0.0, 0.0)
    figures = []
    for step in range(24):
        for server in range(2):
            speed = FAST / 1.8 if server == 1 and step >= 20 else FAST
            window = noisy(rng, speed, 0.1)
            busy[server] += 0.05
            nbytes[server] += 0.05 * window
            est.observe(server, busy[server], nbytes[server])
        speeds = est.speeds(2)
        assert speeds is not None
        figures.append(speeds[1] / speeds[0])
    assert all(0.75 < f < 1.33 for f in figures[:21])  # steps 0..20: not yet, or noise
    assert all(1 / 1.8 / 1.3 < f < 1 / 1.8 * 1.3 for f in figures[21:])  # from step 21
