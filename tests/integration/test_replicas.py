"""Server replicas over real processes: a server SIGKILLed mid-training under
``--replicas 1`` loses nothing (its chunks' backups take over, the workers resend what
it left unanswered, applied once), and the job ends with one process's parameters.
Without replicas, the job ends with a message naming the chunks lost."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import STEPS, Setup, max_difference, reference
from trimtab.launch.job import Job, LaunchConfig

SCRIPT = Path(__file__).with_name("replica_worker.py")

#: Silence after which the coordinator takes a member for dead (servers report their
#: load every 0.25 s, workers heartbeat every second): short, so the test is.
DEAD_AFTER_S = "3"


def _run_and_kill(
    config: LaunchConfig, sizes: tuple[int, ...], out: Path, victim: str
) -> tuple[int, list[str]]:
    """Run the replica job; when rank 0 asks (OUT/kill), SIGKILL the process ``victim``
    ("server 1") and say so (OUT/killed). Returns the job's status and output."""
    lines: list[str] = []
    config = dataclasses.replace(config, deadline_s=100.0)
    command = [sys.executable, str(SCRIPT), "sgd", ",".join(map(str, sizes)), str(out), "7"]
    job = Job(
        config,
        command,
        output=lambda src, line: lines.append(f"[{src}] {line}"),
        extra_env={"TRIMTAB_DEAD_AFTER_S": DEAD_AFTER_S},
    )
    status: list[int] = []
    runner = threading.Thread(target=lambda: status.append(job.run()), daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    while not (out / "kill").exists() and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    procs = [p for p in job._procs if p.source == victim]
    assert procs, f"no {victim} among {[p.source for p in job._procs]}"
    os.kill(procs[0].popen.pid, signal.SIGKILL)
    procs[0].popen.wait()
    (out / "killed").write_text(victim)
    runner.join(110)
    assert status, "the job did not end"
    return status[0], lines


@pytest.mark.timeout(150)
def test_a_server_killed_mid_training_loses_nothing_with_replicas(tmp_path: Path) -> None:
    sizes = (5, 19)
    config = LaunchConfig(workers=2, servers=3, chunk_bytes=512, replicas=1)
    status, lines = _run_and_kill(config, sizes, tmp_path, "server 1")
    assert status == 0, "\n".join(lines[-60:])
    expected = reference(Setup("sgd", sizes))
    for rank in range(len(sizes)):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert len(stats["servers"]) == 2  # the live ones
    versions = [v for s in stats["servers"] for v in s["versions"].values()]
    # Every chunk took every step's update exactly once: none lost, none twice.
    assert versions and all(v == STEPS for v in versions), versions
    assert sorted(int(c) for s in stats["servers"] for c in s["versions"]) == list(
        range(len(stats["job"]["owners"]))
    )
    assert 1 not in stats["job"]["owners"]  # the dead server owns nothing
    assert any("its backups take over" in line for line in lines)
    assert processes_of(config.job) == []


@pytest.mark.timeout(150)
def test_without_replicas_a_dead_server_ends_the_job_naming_its_chunks(tmp_path: Path) -> None:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=512)
    status, lines = _run_and_kill(config, (12, 12), tmp_path, "server 1")
    assert status != 0
    text = "\n".join(lines)
    assert "had no replica and are lost" in text or "server 1 exited" in text, text[-3000:]
    assert processes_of(config.job) == []
