"""Roles on different hosts of the test bed: the job's results are the local run's, and
the bytes between hosts go over TCP (shared memory and the local lane only within a
host, chosen by host identity, not by address)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import Setup, max_difference, reference
from tests.testbed import testbed_factory  # noqa: F401 (a fixture)
from trimtab.launch.hosts import Layout
from trimtab.launch.job import DEADLINE_STATUS, Job, LaunchConfig
from trimtab.launch.testbed import Testbed, list_beds
from trimtab.transport.shm import SHM_DIR, job_prefix

# Jobs across the bed's hosts: the slow tier (`pytest -m slow`, run by .ci/run after the suite).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("equiv_worker.py")
Factory = Callable[[int], Testbed]


def _train(
    bed: Testbed, setup: Setup, out: Path, servers: int = 2, layout: Layout | None = None
) -> dict:
    """The equivalence job on ``bed`` (chunks big enough for shared memory), laid out by
    ``layout`` or the default rule; its settled stats. Fails the test with the job's
    output if it fails."""
    config = LaunchConfig(
        workers=setup.workers, servers=servers, chunk_bytes=8192, deadline_s=150.0
    )
    lines: list[str] = []
    command = [
        sys.executable,
        str(SCRIPT),
        setup.optimizer,
        ",".join(map(str, setup.batch_sizes)),
        str(out),
    ]
    job = Job(
        config,
        command,
        output=lambda src, line: lines.append(f"[{src}] {line}"),
        extra_env={"EQUIV_HIDDEN": str(setup.hidden)},
        testbed=bed,
        layout=layout,
    )
    status = job.run()
    assert status == 0, "\n".join(lines[-(400 if status == DEADLINE_STATUS else 40) :])
    expected = reference(setup)
    for rank in range(setup.workers):
        got = torch.load(out / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    assert processes_of(config.job) == []
    assert list(SHM_DIR.glob(job_prefix(config.job) + "*")) == []
    # The roles bound and advertised the bed's addresses.
    coordinator = (layout or Layout(coordinator=bed.hosts[0])).coordinator
    assert coordinator is not None
    assert job.coordinator_address.startswith(f"tcp://{coordinator.address}:")
    return json.loads((out / "stats.json").read_text())


@pytest.mark.timeout(200)
def test_bsp_across_hosts_matches_one_process_over_tcp(
    testbed_factory: Factory,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Coordinator and server 0 on host 0, server 1 on host 1, a worker on each of hosts
    2 and 3: one process's parameters, and no push through shared memory or the lane
    (/dev/shm is shared by the namespaces: only the host check keeps it out)."""
    bed = testbed_factory(4)
    stats = _train(bed, Setup("adam", (5, 19), hidden=192), tmp_path)
    servers = stats["servers"]
    assert sum(s["pushes"] for s in servers) > 0
    assert [s["shared"] for s in servers] == [0, 0]
    assert [s["lane"] for s in servers] == [0, 0]


@pytest.mark.timeout(200)
def test_a_worker_sharing_a_host_with_a_server_shares_memory_with_it_alone(
    testbed_factory: Factory,  # noqa: F811
    tmp_path: Path,
) -> None:
    """3 workers on 4 hosts, summation mode: worker 2 lands on host 0 beside the
    coordinator and server 0. Server 0 takes its pushes through shared memory and the
    lane and the other workers' over TCP; server 1, alone on host 1, only TCP."""
    bed = testbed_factory(4)
    stats = _train(bed, Setup("sgd-sum", (4, 8, 12), hidden=192), tmp_path)
    # Which server is on host 0 is the order they registered in: either one.
    alone, beside = sorted(stats["servers"], key=lambda s: s["shared"])
    assert alone["pushes"] > 0 and alone["shared"] == 0 and alone["lane"] == 0
    assert beside["shared"] > 0 and 0 < beside["lane"] < beside["pushes"]


@pytest.mark.timeout(200)
def test_a_layout_of_ones_own_puts_each_role_where_it_says(
    testbed_factory: Factory,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The coordinator alone on host 2, the server on host 0, the worker on host 1."""
    bed = testbed_factory(3)
    h = bed.hosts
    layout = Layout(coordinator=h[2], servers=(h[0],), workers=(h[1],))
    stats = _train(bed, Setup("sgd", (24,), hidden=192), tmp_path, servers=1, layout=layout)
    [server] = stats["servers"]
    assert server["pushes"] > 0 and server["shared"] == 0 and server["lane"] == 0


@pytest.mark.timeout(200)
def test_roles_of_one_bed_host_share_memory(
    testbed_factory: Factory,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Every role on one host of the bed (addresses 10.77.X.1, not loopback): the host
    is the same, so pushes go through shared memory and the lane, with the same result."""
    bed = testbed_factory(1)
    setup = Setup("sgd", (12, 12), hidden=192)
    stats = _train(bed, setup, tmp_path)
    servers = stats["servers"]
    assert sum(s["shared"] for s in servers) > 0
    assert sum(s["lane"] for s in servers) > 0


@pytest.mark.timeout(200)
def test_a_profile_on_the_bed_measures_each_role_on_its_host(
    testbed_factory: Factory,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``bench datapath --testbed --profile``: the roles in the bed's namespaces are
    still found and measured, thread by thread (without py-spy: the counters alone)."""
    from trimtab_tools.bench.profile import profile_datapath

    bed = testbed_factory(4)
    summary = profile_datapath(
        tmp_path, [16 << 20], 5, 1 << 20, warmup=1, install=False, testbed=bed
    )
    roles = summary["roles"]
    assert roles["worker"]["processes"] == 2 and roles["server"]["processes"] == 2
    for role in ("worker", "server"):
        # Each process's threads were read while they all ran, ZeroMQ's I/O thread among
        # them (its CPU in a few steps may be under the counters' 10 ms tick).
        assert any(name.startswith("ZMQbg") for name in roles[role]["cpu_ms_per_step_by_thread"])
    assert summary["cpu_ms_per_step_all"] > 0
    assert summary["shared_pushes"] == 0  # between hosts, never through shared memory
    assert summary["steps"] == 5 and (tmp_path / "summary.txt").exists()


@pytest.mark.timeout(120)
def test_the_lean_ps_runs_with_each_role_on_its_host(testbed_factory: Factory) -> None:  # noqa: F811
    """``bench datapath --testbed --peers lean``: the lean PS's roles on trimtab's hosts
    (a server binds its host's bed address, which only its namespace has), its workers
    checking the SGD result of every step."""
    from trimtab.launch.hosts import place
    from trimtab_tools.bench.baselines.leanps import run_lean

    bed = testbed_factory(4)
    r = run_lean([4 << 20], 3, 1 << 20, warmup=1, layout=place(bed.hosts, 2, 2), timeout_s=100)
    assert r["steps"] == 3 and r["median_s"] > 0


@pytest.mark.timeout(200)
def test_bench_datapath_on_the_bed_reports_the_lean_ps_beside_trimtab() -> None:
    """``bench datapath --testbed --peers lean``'s figures: trimtab's step and the lean
    PS's on the same hosts in one run, each against the bed's raw TCP floor."""
    from trimtab.launch.testbed import unavailable
    from trimtab_tools.bench.bed import measure_datapath

    if (why := unavailable()) is not None:
        pytest.skip(f"no multi-host test bed here: {why}")
    r = measure_datapath([4 << 20], 3, 1 << 20, lean=True)
    assert r["testbed"] and r["shared_memory"] is False  # every byte over the bed's TCP
    assert r["lean_step_s"] > 0 and r["step_s"] > 0 and r["floor_step_s"] > 0
    assert r["step_over_lean"] == pytest.approx(r["step_s"] / r["lean_step_s"], rel=0.01)
    assert r["lean_over_floor"] == pytest.approx(r["lean_step_s"] / r["floor_step_s"], rel=0.01)


@pytest.mark.timeout(280)
def test_the_example_job_across_four_hosts_reaches_the_local_accuracy() -> None:
    from trimtab.launch.testbed import unavailable

    if (why := unavailable()) is not None:
        pytest.skip(f"no multi-host test bed here: {why}")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    results = {}
    before = {b.id for b in list_beds()}
    for hosts in (0, 4):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "trimtab",
                "train",
                "--epochs",
                "10",
                "--json",
                "--testbed",
                str(hosts),
            ],
            capture_output=True,
            text=True,
            timeout=130,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[hosts] = json.loads(proc.stdout.strip().splitlines()[-1])
    local, bed = results[0], results[4]
    assert bed["testbed"] == 4 and local["testbed"] == 0
    assert bed["test_accuracy"] >= 0.9
    assert bed["test_accuracy"] >= local["test_accuracy"] - 0.01
    assert bed["pushes"]["pushes"] > 0
    assert bed["pushes"]["shared"] == 0 and bed["pushes"]["lane"] == 0  # TCP only
    assert local["pushes"]["lane"] > 0  # the local run took the lane: the check counts
    assert [b.id for b in list_beds() if b.id not in before and not b.alive] == []  # removed


def test_launch_config_refuses_a_bed_it_cannot_grow() -> None:
    from trimtab.errors import ConfigError

    with pytest.raises(ConfigError, match="--testbed"):
        LaunchConfig(testbed=2, servers=1, max_servers=2)
    with pytest.raises(ConfigError, match="--testbed"):
        LaunchConfig(testbed=-1)
    assert dataclasses.replace(LaunchConfig(), testbed=3).testbed == 3
