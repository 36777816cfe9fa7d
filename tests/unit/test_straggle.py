"""Straggler specs, slowdown schedules, the throttling transport and the worker step
hook that inject them, and lag-based straggler detection."""

from __future__ import annotations

import time

import pytest

from trimtab import ConfigError
from trimtab.faults.slowdown import WorkerSlowdown
from trimtab.faults.stragglers import (
    ServerStraggler,
    StragglerSpec,
    WorkerStraggler,
    parse_stragglers,
)
from trimtab.faults.throttle import ThrottledTransport
from trimtab.policies.detection import DETECTORS
from trimtab.protocol.messages import Data, encode
from trimtab.transport import Fabric, Transport


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


class _Node:
    """What a throttle follows: an index, a step, and where its pauses are counted."""

    def __init__(self, index: int = 0, step: int = 0) -> None:
        self.index = index
        self.step = step
        self.stalls: list[float] = []

    def stalled(self, seconds: float) -> None:
        self.stalls.append(seconds)


# A pause these tests must not see would last PACED_S or more; one they must see lasts
# at least its share of it. Only lower bounds are tight: a busy machine only adds time.
PACED_S = 3.0
DELAY = "server:0:delay=6s/MB"  # 0.5 MB: 3 s; 0.05 MB: 0.3 s


def _throttled(spec: str) -> tuple[ThrottledTransport, Transport, Transport, _Node]:
    """A throttled server transport on a fabric, a worker and a coordinator to reach it."""
    fabric = Fabric()
    coordinator = fabric.transport(bind=True)
    inner = fabric.transport(bind=True)
    throttle = ThrottledTransport(inner, parse_stragglers(spec), "job", coordinator.address)
    node = _Node()
    throttle.follow(node)
    return throttle, fabric.transport(bind=False), coordinator, node


def _timed_recv(throttle: ThrottledTransport) -> float:
    start = time.monotonic()
    assert throttle.recv(5.0) is not None
    return time.monotonic() - start


def _push(nbytes: int, **more: object) -> list[bytes]:
    header = encode({"o": int(Data.PUSH), "i": 1, "j": "job", "c": 0, **more})
    return [header, b"x" * nbytes] if nbytes else [header]


def test_throttled_transport_paces_received_bytes_and_counts_the_pause_as_busy() -> None:
    throttle, worker, coordinator, node = _throttled(DELAY)
    worker.send(worker.connect(throttle.address), _push(50_000))
    assert _timed_recv(throttle) >= 0.3  # 0.05 MB at 6 s/MB
    assert len(node.stalls) == 1 and node.stalls[0] >= 0.3
    # The coordinator's traffic, either way, is not paced.
    to_coordinator = throttle.connect(coordinator.address)
    start = time.monotonic()
    throttle.send(to_coordinator, _push(500_000))
    hello = coordinator.recv(5.0)
    assert hello is not None
    coordinator.send(hello.peer, _push(500_000))
    assert _timed_recv(throttle) < PACED_S / 2 and time.monotonic() - start < PACED_S / 2
    assert len(node.stalls) == 1
    assert throttle.recv_queued() is None  # one message at a time
    throttle.close()


def test_throttled_transport_counts_shared_memory_and_values_sent() -> None:
    throttle, worker, _, _ = _throttled(DELAY)
    to_server = worker.connect(throttle.address)
    # A whole push and value: the throttle counts what reads (headers.read_push/read_value).
    shm = {"e": 1, "r": 0, "k": 0, "w": 1.0, "n": 12_500, "dt": "float32"}
    shm["sm"] = ["trimtab-job-w0", 0, 50_000]
    worker.send(to_server, _push(0, **shm))
    assert _timed_recv(throttle) >= 0.3  # the gradient in shared memory: 0.05 MB
    worker.send(to_server, [encode({"o": int(Data.STATS), "i": 2, "j": "job"})])
    got = throttle.recv(5.0)
    assert got is not None
    value = {"o": int(Data.VALUE), "i": 2, "j": "job", "c": 0, "v": 1, "k": 1, "n": 12_500}
    value["dt"] = "float32"
    start = time.monotonic()
    throttle.send(got.peer, [encode({**value, "sm": 1})])  # the value went into the slot
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    throttle.send(got.peer, [encode({"o": int(Data.ACK), "i": 2, "j": "job"}), b"x" * 500_000])
    assert time.monotonic() - start < PACED_S / 2  # only values are paced on the way out
    throttle.close()


def test_throttled_transport_paces_only_its_server_once_known_and_in_its_window() -> None:
    throttle, worker, _, node = _throttled("server:1:delay=6s/MB@3-")
    to_server = worker.connect(throttle.address)
    node.index = -1  # not registered yet
    worker.send(to_server, _push(500_000))
    assert _timed_recv(throttle) < PACED_S / 2
    node.index = 1  # server 1, before step 3
    worker.send(to_server, _push(500_000))
    assert _timed_recv(throttle) < PACED_S / 2
    assert sum(node.stalls) < PACED_S / 2
    node.step = 3
    worker.send(to_server, _push(50_000))
    assert _timed_recv(throttle) >= 0.3
    throttle.close()


def test_worker_slowdown_sleeps_in_proportion_and_reports_the_slow_time() -> None:
    specs = parse_stragglers("worker:1:slowdown=3@2-")
    slow, other = WorkerSlowdown(specs, 1), WorkerSlowdown(specs, 0)
    assert slow and not other
    assert slow(0, 0.02) == 0.02  # before its window
    start = time.monotonic()
    assert slow(2, 0.02) == pytest.approx(0.06)
    assert time.monotonic() - start >= 0.04  # (3 - 1) x 20 ms
    assert other(2, 0.02) == 0.02
    slow.close()
    other.close()


def test_a_paced_link_hands_over_one_message_at_a_time_only_in_its_window() -> None:
    throttle, worker, _, node = _throttled("server:0:delay=6s/MB@3-")
    to_server = worker.connect(throttle.address)
    for _ in range(2):
        worker.send(to_server, _push(10))
    assert throttle.recv(5.0) is not None
    assert throttle.recv_queued() is not None  # before step 3: batched as without it
    node.step = 3
    for _ in range(2):
        worker.send(to_server, _push(10))
    assert throttle.recv(5.0) is not None
    assert throttle.recv_queued() is None  # paced: the next waits for the next recv
    assert throttle.recv(5.0) is not None
    throttle.close()


def test_a_server_no_spec_names_is_never_paced_and_keeps_its_batching() -> None:
    throttle, worker, _, node = _throttled("server:1:delay=6s/MB")  # it is server 0
    to_server = worker.connect(throttle.address)
    for _ in range(2):
        worker.send(to_server, _push(500_000))
    start = time.monotonic()
    assert throttle.recv(5.0) is not None and throttle.recv_queued() is not None
    assert time.monotonic() - start < PACED_S / 2 and node.stalls == []
    throttle.close()
