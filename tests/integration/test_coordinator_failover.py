"""Coordinator failover over real processes (``trimtab run``): the coordinator SIGKILLed
mid-training is replaced by the launcher at the same address, the servers and workers
rejoin it, and the job ends with one process's parameters, every update applied once:
no rollback, nothing lost. Twice in one job, and with a server lost after it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import STEPS, Setup, max_difference, reference
from tests.integration.test_replicas import _run_and_kill
from trimtab.launch.job import Job, LaunchConfig

KILLS = [
    # (optimizer, servers, replicas, {after step: the process killed}, rank 0 waits)
    ("sgd", 2, 0, {6: "coordinator"}, False),  # killed while rounds fly
    ("adam", 3, 1, {3: "coordinator", 8: "coordinator", 12: "server 1"}, True),
]


def rebuilt(victims: dict[int, str]) -> Callable[[Job, int, list[str]], None]:
    """Before kill ``n``: the job rebuilt after each coordinator killed before it (the
    workers train on meanwhile, and reach the next kill's step sooner)."""

    def wait(job: Job, n: int, lines: list[str]) -> None:
        before = sum(v == "coordinator" for v in list(victims.values())[:n])
        deadline = time.monotonic() + 60
        while sum("rebuilt the job from its members" in line for line in lines) < before:
            assert time.monotonic() < deadline, "\n".join(lines[-40:])
            time.sleep(0.02)

    return wait


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("optimizer", "servers", "replicas", "victims", "waits"),
    KILLS,
    ids=[f"{o}-{s}s-r{r}-{len(v)}kills" for o, s, r, v, _ in KILLS],
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
    assert status == 0, "\n".join(lines[-60:])
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
    if replicas:  # the replacement coordinator failed the lost server over
        assert "its backups take over" in said and stats["job"]["failovers"] == 1
    assert processes_of(config.job) == []
