"""Straggler specs, slowdown schedules, and lag-based straggler detection."""

from __future__ import annotations

import time

import pytest

from trimtab import ConfigError
from trimtab.faults.stragglers import (
    ServerStraggler,
    StragglerSpec,
    WorkerStraggler,
    parse_stragglers,
)
from trimtab.policies.detection import DETECTORS


def test_parse_static_transient_and_drift() -> None:
    specs = parse_stragglers(
        ["worker:2:slowdown=3@0-", "worker:1:slowdown=4@20-60;worker:3:drift=0.3"]
    )
    assert specs == [
        StragglerSpec("worker", 2, "slowdown", 3.0, 0, None),
        StragglerSpec("worker", 1, "slowdown", 4.0, 20, 60),
        StragglerSpec("worker", 3, "drift", 0.3, 0, None),
    ]
    assert str(specs[1]) == "worker:1:slowdown=4@20-60"


def test_parse_server_kinds_in_base_units() -> None:
    specs = parse_stragglers(
        "server:1:bandwidth=25MB/s@20-80;server:0:delay=4ms/MB;server:2:bandwidth=1MiB/s"
    )
    assert specs[0] == StragglerSpec("server", 1, "bandwidth", 25e6, 20, 80)
    assert specs[1].kind == "delay" and specs[1].value == pytest.approx(4e-9)
    assert specs[2].value == 1024.0**2


def test_server_bandwidth_cap_paces_traffic_only_when_active() -> None:
    throttle = ServerStraggler(parse_stragglers("server:0:bandwidth=10MB/s@5-"), 0)
    assert throttle and not ServerStraggler(parse_stragglers("server:0:delay=1s/MB"), 1)
    start = time.monotonic()
    for _ in range(10):
        throttle.on_bytes(100_000, step=0)  # before the window: free
    assert time.monotonic() - start < 0.05
    start = time.monotonic()
    for _ in range(10):
        throttle.on_bytes(100_000, step=5)  # 1 MB at 10 MB/s: 0.1 s, less one burst
    assert 0.07 <= time.monotonic() - start < 0.5


def test_server_delay_is_per_byte() -> None:
    throttle = ServerStraggler(parse_stragglers("server:0:delay=100ms/MB"), 0)
    start = time.monotonic()
    throttle.on_bytes(500_000, step=0)
    assert 0.05 <= time.monotonic() - start < 0.3


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("worker:2:slowdown", "expected ROLE:INDEX"),
        ("worker:x:slowdown=3", "expected ROLE:INDEX"),
        ("worker:2:slowdown=0.5", ">= 1"),
        ("worker:2:warp=3", "worker kinds"),
        ("worker:2:slowdown=3@9-4", "END > START"),
        ("node:2:slowdown=3", "ROLE is worker or server"),
        ("server:1:bandwidth=25", "needs a unit"),
        ("server:1:bandwidth=25furlongs/s", "needs a unit"),
        ("server:1:slowdown=3", "server kinds"),
        ("server:0:delay=-1ms/MB", "must be positive"),
    ],
)
def test_bad_specs_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_stragglers(text)


def test_schedule_applies_only_to_its_worker_and_steps() -> None:
    specs = parse_stragglers("worker:1:slowdown=4@2-4")
    mine, other = WorkerStraggler(specs, 1), WorkerStraggler(specs, 0)
    assert [mine.factor(c) for c in range(6)] == [1, 1, 4, 4, 1, 1]
    assert not other and other.factor(3) == 1.0


def test_drift_is_a_bounded_reproducible_random_walk() -> None:
    specs = parse_stragglers("worker:0:drift=0.5")
    a = [WorkerStraggler(specs, 0).factor(c) for c in range(1)]
    walk = WorkerStraggler(specs, 0)
    factors = [walk.factor(c) for c in range(200)]
    again = WorkerStraggler(specs, 0)
    assert [again.factor(c) for c in range(200)] == factors  # seeded by rank
    assert all(1.0 <= f <= WorkerStraggler.MAX_DRIFT for f in factors)
    assert len({round(f, 6) for f in factors}) > 20 and a[0] == factors[0]


def test_lag_detector_needs_a_lasting_outlier() -> None:
    det = DETECTORS.create("lag")  # min_lag 3, k 2, patience 2
    assert det.stragglers({0: 10, 1: 10, 2: 9, 3: 5}) == set()  # first time: not yet
    assert det.stragglers({0: 11, 1: 11, 2: 10, 3: 5}) == {3}
    assert det.stragglers({0: 12, 1: 12, 2: 11, 3: 11}) == set()  # caught up
    assert det.stragglers({0: 5, 1: 4, 2: 3, 3: 2}) == set()  # all within min_lag
