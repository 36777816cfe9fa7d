"""``TRIMTAB_SPIN_US``: what it accepts, when ``trimtab run`` turns polling on, and when a
transport polls (only while its spins catch messages)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trimtab import WorkerConfig
from trimtab.errors import ConfigError
from trimtab.launch.cores import available_cores, cgroup_cpu_quota, cores_busy, machine_cpu
from trimtab.launch.job import Job, LaunchConfig
from trimtab.roles.server import ServerConfig
from trimtab.transport import ZmqTransport
from trimtab.transport.spin import SPIN_DEFAULT_US, SPIN_ENV, SpinPolicy, parse_spin, spin_from_env

COORD = "tcp://127.0.0.1:5555"


@pytest.mark.parametrize(
    ("raw", "seconds"), [("", 0.0), (" 0 ", 0.0), ("50", 5e-5), ("2.5", 2.5e-6)]
)
def test_spin_is_read_in_microseconds(raw: str, seconds: float) -> None:
    assert parse_spin(raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw", ["abc", "-1", "10001", "nan", "1e9"])
def test_a_bad_spin_says_what_to_give(raw: str) -> None:
    with pytest.raises(ConfigError, match=f"{SPIN_ENV}=.*from 0 \\(never\\) to 10000"):
        parse_spin(raw)


def test_spin_comes_from_the_environment_the_edge_passes() -> None:
    assert spin_from_env({}) == 0.0  # unset: a node sleeps at once
    assert spin_from_env({SPIN_ENV: "80"}) == pytest.approx(8e-5)
    with pytest.raises(ConfigError, match=SPIN_ENV):
        spin_from_env({SPIN_ENV: "fast"})


def test_a_transport_spins_only_as_told_and_checks_it() -> None:
    transport = ZmqTransport(bind=False, lane=False, spin_s=5e-5)
    try:
        assert transport.spin_s == pytest.approx(5e-5)
    finally:
        transport.close()
    with pytest.raises(ConfigError, match="spin_s"):
        ZmqTransport(bind=False, lane=False, spin_s=1.0)


@pytest.mark.parametrize("spin_s", [-1e-6, 0.02])
def test_configs_refuse_a_spin_out_of_range(spin_s: float) -> None:
    with pytest.raises(ConfigError, match="spin_s"):
        WorkerConfig(coordinator=COORD, job="j", spin_s=spin_s)
    with pytest.raises(ConfigError, match="spin_s"):
        ServerConfig(coordinator=COORD, job="j", spin_s=spin_s)


@pytest.mark.parametrize(
    ("workers", "servers", "max_servers", "cores", "expected"),
    [
        (1, 1, 0, 2, str(SPIN_DEFAULT_US)),  # a core each
        (2, 2, 0, 2, "0"),  # oversubscribed: polling would take a core another needs
        (2, 2, 0, 4, str(SPIN_DEFAULT_US)),
        (2, 2, 3, 4, "0"),  # the servers it may add count too
    ],
)
def test_trimtab_run_polls_only_where_every_process_has_a_core(
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    servers: int,
    max_servers: int,
    cores: int,
    expected: str,
) -> None:
    monkeypatch.delenv(SPIN_ENV, raising=False)
    monkeypatch.setattr("trimtab.launch.job.available_cores", lambda: cores)
    config = LaunchConfig(workers=workers, servers=servers, max_servers=max_servers)
    assert Job(config, ["true"])._role_env()[SPIN_ENV] == expected


def test_trimtab_run_keeps_the_users_spin_and_checks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trimtab.launch.job.available_cores", lambda: 64)
    monkeypatch.setenv(SPIN_ENV, "0")
    assert Job(LaunchConfig(workers=1, servers=1), ["true"])._role_env()[SPIN_ENV] == "0"
    job = Job(LaunchConfig(workers=1, servers=1), ["true"], extra_env={SPIN_ENV: "fast"})
    with pytest.raises(ConfigError, match=SPIN_ENV):
        job._role_env()


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),  # cgroup v2: a limit of 2 CPUs
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),  # no limit
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "garbage"}, None),
        ({}, None),
    ],
)
def test_a_containers_cpu_quota_is_read_from_its_cgroup(
    tmp_path: Path, files: dict[str, str], expected: float | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == expected


def test_a_cpu_quota_bounds_the_cores_polling_counts_on(tmp_path: Path) -> None:
    # A container limited to 1.5 CPUs on a bigger machine: affinity shows every core of
    # the host, but the processes of a job share two at most.
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert available_cores(tmp_path) == min(2, len(os.sched_getaffinity(0)))
    assert available_cores(tmp_path / "none") == len(os.sched_getaffinity(0))


def test_the_cores_busy_come_from_the_machines_counters(tmp_path: Path) -> None:
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal: busy 100+0+50+0+0+50 ticks
    stat.write_text("cpu  100 0 50 300 20 0 0 50 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    before = machine_cpu(stat)
    assert before == pytest.approx((200 * tick, 320 * tick))
    stat.write_text("cpu  300 0 150 300 20 0 0 50 0 0\n")  # 300 ticks busy since, no idle
    after = machine_cpu(stat)
    assert cores_busy(before, after, wall_s=150 * tick) == pytest.approx(2.0)
    assert cores_busy(before, None, wall_s=1.0) is None
    assert cores_busy(before, after, wall_s=0.0) is None
    assert machine_cpu(tmp_path / "none") is None
    stat.write_text("cpu  garbage\n")
    assert machine_cpu(stat) is None
    real = machine_cpu()
    assert real is None or (real[0] > 0 and real[1] >= 0)


def _misses_to_stop() -> int:
    """Consecutive misses after which a fresh policy stops spinning."""
    rate, n = 1.0, 0
    while rate >= SpinPolicy.KEEP:
        rate -= rate / SpinPolicy.WINDOW
        n += 1
    return n


def test_spinning_stops_when_spins_catch_nothing_and_is_probed_until_they_do() -> None:
    policy = SpinPolicy()
    for _ in range(_misses_to_stop()):
        assert policy.should_spin()
        policy.spun(False)
    # Off (another process holds the core the peer needs, or nothing is coming): one
    # wait in PROBE_EVERY still spins, to find out whether spinning pays again.
    probes = [policy.should_spin() for _ in range(SpinPolicy.PROBE_EVERY * 4)]
    assert sum(probes) == 4 and probes[SpinPolicy.PROBE_EVERY - 1]
    for _ in range(SpinPolicy.PROBE_EVERY * 10):
        if policy.should_spin():
            policy.spun(True)  # the probes catch their messages: spinning pays again
    assert all(policy.should_spin() for _ in range(SpinPolicy.PROBE_EVERY))


def test_spinning_goes_on_while_most_spins_catch_their_message() -> None:
    policy = SpinPolicy()
    for i in range(1000):
        assert policy.should_spin()
        policy.spun(i % 3 != 2)  # two in three
    assert (policy.hits, policy.misses) == (667, 333)


def test_a_transport_spins_only_while_its_spins_catch_messages() -> None:
    server = ZmqTransport(bind=True, lane=False)
    client = ZmqTransport(bind=False, lane=False)
    try:
        peer = client.connect(server.address)
        client.send(peer, [b"hello"])  # connects (not timed: it may take a while)
        assert server.recv(10.0) is not None
        server.spin_s = 200e-6
        client.send(peer, [b"ping"])
        time.sleep(0.05)  # it has arrived: the spin's first poll sees it
        env = server.recv(1.0)
        assert env is not None and env.frames[0].tobytes() == b"ping"
        assert (server.spins.hits, server.spins.misses) == (1, 0)
        # Waits that nothing answers: spins stop after a few, but for the probes.
        waits = SpinPolicy.PROBE_EVERY + _misses_to_stop()
        for _ in range(waits):
            assert server.recv(0.001) is None
        assert server.spins.misses == _misses_to_stop() + 1  # one probe
    finally:
        client.close()
        server.close()
