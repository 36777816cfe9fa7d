"""Elastic workers over real processes and TCP (issue 20): a worker killed with SIGKILL
mid-training is dropped and the job finishes; a worker joins a running job at a step
boundary; below ``--min-workers`` the job ends. Under BSP the final parameters equal a
one-process run over the samples the workers actually processed."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.elastic_job import reference
from tests.equivalence_job import max_difference
from trimtab.data import processed_samples
from trimtab.launch.job import Job, LaunchConfig
from trimtab.transport.shm import SHM_DIR, job_prefix

SCRIPT = Path(__file__).with_name("elastic_worker.py")
# A SIGKILLed worker is noticed by its silence: short, but well above the nodes' 1 s
# heartbeats even with every core busy.
FAST_DETECTION = {"TRIMTAB_HEARTBEAT_S": "0.5", "TRIMTAB_DEAD_AFTER_S": "4"}


def _run(config: LaunchConfig, out: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    lines: list[str] = []
    config = dataclasses.replace(config, deadline_s=150.0)
    job = Job(
        config,
        [sys.executable, str(SCRIPT), str(out)],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
        extra_env={**FAST_DETECTION, **env},
    )
    status = job.run()
    # A SIGKILLed worker leaves its arena (removing it is another fix of issue 20's).
    for leftover in SHM_DIR.glob(job_prefix(config.job) + "*"):
        leftover.unlink(missing_ok=True)
    return status, lines


def _final(out: Path, rank: int) -> list[torch.Tensor]:
    return torch.load(out / f"rank{rank}.pt")


@pytest.mark.timeout(200)
def test_a_killed_worker_is_dropped_and_the_job_equals_one_process(tmp_path: Path) -> None:
    config = LaunchConfig(workers=3, servers=2, chunk_bytes=512, min_workers=2)
    status, lines = _run(config, tmp_path, {"ELASTIC_KILL": "2:7"})
    assert status == 0, "\n".join(lines[-60:])
    samples = processed_samples(tmp_path)
    assert len(samples) == 20
    # Worker 2 processed steps 0..6; from step 7 on, the two others (step 7 with the
    # shares they had, then the whole global batch split between them).
    assert all(len(samples[s]) == 24 for s in range(7)), samples
    assert len(samples[7]) == 16
    assert all(len(samples[s]) == 24 for s in range(8, 20))
    expected = reference(samples)
    for rank in (0, 1):
        assert max_difference(_final(tmp_path, rank), expected) < 1e-5, f"rank {rank}"
    assert not (tmp_path / "rank2.pt").exists()
    assert processes_of(config.job) == []


@pytest.mark.timeout(200)
def test_a_worker_joins_with_the_current_values_and_the_job_equals_one_process(
    tmp_path: Path,
) -> None:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=512, max_workers=3)
    status, lines = _run(config, tmp_path, {"ELASTIC_GROW": "4:3"})
    assert status == 0, "\n".join(lines[-60:])
    joined = json.loads((tmp_path / "joined2.json").read_text())["clock"]
    assert 5 <= joined < 20, joined  # after the ask, at a step boundary
    samples = processed_samples(tmp_path)
    assert all(len(samples[s]) == 24 for s in range(20))
    # The global batch stays 24: split over 2 workers, then over 3 from its first step.
    rows = (tmp_path / "samples-rank2.jsonl").read_text().splitlines()
    assert [json.loads(r)[0] for r in rows] == list(range(joined, 20))
    assert all(len(json.loads(r)[1]) == 8 for r in rows)
    # It started from the job's values after `joined` steps, not its own.
    pulled = torch.load(tmp_path / "joined2.pt")
    assert max_difference(pulled, reference(samples, joined)) < 1e-5
    expected = reference(samples)
    for rank in range(3):
        assert max_difference(_final(tmp_path, rank), expected) < 1e-5, f"rank {rank}"
    assert processes_of(config.job) == []


@pytest.mark.timeout(200)
def test_below_min_workers_the_job_ends_with_a_clear_message(tmp_path: Path) -> None:
    config = LaunchConfig(workers=2, servers=1, chunk_bytes=512, min_workers=2, max_workers=3)
    status, lines = _run(config, tmp_path, {"ELASTIC_KILL": "1:5"})
    assert status != 0
    assert any("below --min-workers 2" in line for line in lines), "\n".join(lines[-40:])
    assert processes_of(config.job) == []
