"""Coordinator failover over real processes (``trimtab run``): the coordinator SIGKILLed
mid-training is replaced by the launcher at the same address, the servers and workers
rejoin it, and the job ends with one process's parameters, every update applied once:
no rollback, nothing lost. Twice in one job, with a server lost between (failed over by
the replacement, its own replacement given the job's credentials) and rejoining after."""

from __future__ import annotations

import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import STEPS, Setup, max_difference, reference
from tests.integration.test_replicas import _run_and_kill
from tests.testbed import testbed_factory  # noqa: F401 (a fixture)
from trimtab.launch.job import Job, LaunchConfig
from trimtab.launch.testbed import Testbed

#: The step after which the 2 x 2 job's coordinator dies: a random one (said on failure).
SEED = random.randrange(1 << 30)
AT = random.Random(SEED).randrange(1, STEPS - 2)

KILLS = [
    # (optimizer, servers, replicas, {after step: the process killed}, rank 0 waits)
    ("sgd", 2, 0, {AT: "coordinator"}, False),  # at a random step, while rounds fly
    ("adam", 2, 1, {3: "coordinator", 6: "server 1", 12: "coordinator"}, True),
]


def rebuilt(victims: dict[int, str]) -> Callable[[Job, int, list[str]], None]:
    """Before kill ``n``: the job rebuilt after each coordinator killed before it (the
    workers train on meanwhile, and reach the next kill's step sooner), and its
    replication restored after each server killed before it."""

    def wait(job: Job, n: int, lines: list[str]) -> None:
        before = list(victims.values())[:n]
        deadline = time.monotonic() + 60
        while sum("rebuilt the job from its members" in line for line in lines) < before.count(
            "coordinator"
        ) or sum("replication restored" in line for line in lines) < len(before) - before.count(
            "coordinator"
        ):
            assert time.monotonic() < deadline, "\n".join(lines[-40:])
            time.sleep(0.02)

    return wait


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("optimizer", "servers", "replicas", "victims", "waits"),
    [  # the second in the slow tier (`pytest -m slow`, which .ci/run runs too)
        pytest.param(*k, id=f"{k[0]}-{k[1]}s-r{k[2]}-{len(k[3])}kills", marks=marks)
        for k, marks in zip(KILLS, [(), pytest.mark.slow], strict=True)
    ],  # (no step in the ids: see AT)
)
def test_a_killed_coordinator_is_replaced_and_the_job_equals_one_process(
    tmp_path: Path,
    optimizer: str,
    servers: int,
    replicas: int,
    victims: dict[int, str],
    waits: bool,
) -> None:
    sizes = (5, 19)
    config = LaunchConfig(workers=2, servers=servers, chunk_bytes=512, replicas=replicas)
    env = None if waits else {"REPLICA_NOWAIT": "1"}
    status, lines = _run_and_kill(
        config, sizes, tmp_path, victims, optimizer, env, before_kill=rebuilt(victims)
    )
    said = "\n".join(lines)
    assert status == 0, f"(killed after step {AT}, seed {SEED})\n" + "\n".join(lines[-60:])
    expected = reference(Setup(optimizer, sizes))
    for rank in range(len(sizes)):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    stats = json.loads((tmp_path / "stats.json").read_text())
    versions = [v for s in stats["servers"] for v in s["versions"].values()]
    # Every chunk took every step's update exactly once: none lost, none twice.
    assert versions and all(v == STEPS for v in versions), versions
    coordinators = sum(v == "coordinator" for v in victims.values())
    assert said.count("its replacement starts at") == coordinators, said
    assert said.count("rebuilt the job from its members") == coordinators, said
    for rank in (0, 1):  # each worker took each replacement's proof
        took = [line for line in lines if line.startswith(f"[worker {rank}]")]
        assert sum("a new coordinator took over" in line for line in took) == coordinators
    if replicas:  # the replacement coordinator failed the lost server over, and the
        # server started in its place took backups (it holds the job's member key), then
        # rejoined the next replacement
        assert "its backups take over" in said  # (the counters start afresh in each)
        assert stats["job"]["unbacked"] == 0 and "replication restored" in said, said
        # The survivor (0 or 1: the first servers register in any order) and server 2.
        live = sorted(s["index"] for s in stats["servers"])
        assert len(live) == 2 and live[1] == 2, stats["servers"]
    assert processes_of(config.job) == []


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_on_the_bed_a_killed_coordinator_is_replaced_and_the_job_equals_one_process(
    testbed_factory: Callable[[int], Testbed],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The 2 x 2 job with each role on a host of its own but the coordinator's (beside
    server 0), every byte between hosts over TCP: its coordinator killed at a random step
    is replaced on its host, and the job equals one process."""
    bed = testbed_factory(4)
    sizes = (5, 19)
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=512)
    victims = {AT: "coordinator"}
    env = {"REPLICA_NOWAIT": "1"}
    status, lines = _run_and_kill(
        config, sizes, tmp_path, victims, "sgd", env, before_kill=rebuilt(victims), testbed=bed
    )
    said = "\n".join(lines)
    assert status == 0, f"(killed after step {AT}, seed {SEED})\n" + "\n".join(lines[-60:])
    expected = reference(Setup("sgd", sizes))
    for rank in range(len(sizes)):
        assert max_difference(torch.load(tmp_path / f"rank{rank}.pt"), expected) < 1e-5
    stats = json.loads((tmp_path / "stats.json").read_text())
    versions = [v for s in stats["servers"] for v in s["versions"].values()]
    assert versions and all(v == STEPS for v in versions), versions
    assert said.count("rebuilt the job from its members: 2 servers, 2 workers back") == 1
    assert processes_of(config.job) == []


@pytest.mark.timeout(120)
def test_a_broadcast_in_flight_when_the_coordinator_dies_completes_under_its_replacement(
    tmp_path: Path,
) -> None:
    """Rank 0 broadcast its parameters, rank 1 took them, and the coordinator dies
    before rank 2 asks: the root's put (answered once every worker took the value) goes
    again to the replacement, rank 1 tells it the value was taken, and rank 2 gets the
    root's values from it. Before, the root was answered at once and went on, and rank
    2 waited for a value the replacement never had."""
    config = LaunchConfig(workers=3, servers=1, chunk_bytes=512, deadline_s=90.0)
    lines: list[str] = []
    script = Path(__file__).with_name("broadcast_failover_worker.py")
    job = Job(
        config,
        [sys.executable, str(script), str(tmp_path)],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
    )
    status: list[int] = []
    runner = threading.Thread(target=lambda: status.append(job.run()), daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "kill0").exists():
        assert runner.is_alive() and time.monotonic() < deadline, "\n".join(lines[-60:])
        time.sleep(0.02)
    (coordinator,) = [p for p in job._procs if p.source == "coordinator"]
    coordinator.handle.signal(signal.SIGKILL)
    coordinator.handle.wait()
    rebuilt({0: "coordinator", 1: "coordinator"})(job, 1, lines)  # (one replacement)
    (tmp_path / "killed0").write_text("1")
    runner.join(80)
    said = "\n".join(lines[-60:])
    assert status == [0], said
    root = torch.load(tmp_path / "rank0.pt")
    for rank in (1, 2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert all(torch.equal(got[k], root[k]) for k in root), f"rank {rank}\n{said}"
    assert "\n".join(lines).count("rebuilt the job from its members") == 1
    assert processes_of(config.job) == []
