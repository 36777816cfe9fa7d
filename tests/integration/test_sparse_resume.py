"""A job with tables on the servers (``trimtab.nn.EmbeddingBag``), killed after a
checkpoint and resumed from it, ends with the parameters of one process never stopped:
the rows and their optimizer's state (Adagrad's sums, SparseAdam's moments) come back
from the checkpoint, and the workers' tables, declared again, take them instead of
seeding their start (issue 36)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.integration.test_checkpoints import TRIMTAB, kill_after_a_checkpoint
from tests.integration.test_sparse import SCRIPT
from tests.sparse_job import STEPS, max_difference, reference
from trimtab.launch.job import Job, LaunchConfig
from trimtab.roles.coordinator.manifest import MANIFEST, find_checkpoint
from trimtab.settings import CheckpointSettings

#: Both server-state optimizers of a table: Adagrad (one optimizer for the table and the
#: MLP) and SparseAdam beside Adam (two), each a table on the servers.
CASES = ("adagrad:server", "sparseadam:server")


@pytest.mark.slow  # (a kill and a resume, 20 to 30 s: the slow tier, which .ci/run runs)
@pytest.mark.timeout(240)
def test_a_killed_job_with_server_tables_resumes_from_its_checkpoint_exactly(
    tmp_path: Path,
) -> None:
    ckpts, log, first = tmp_path / "ckpts", tmp_path / "log", tmp_path / "first"
    first.mkdir()
    proc = subprocess.Popen(
        [
            *TRIMTAB,
            "run",
            "-w",
            "2",
            "-s",
            "2",
            "--deadline",
            "100",
            "--checkpoint-every",
            "4",
            "--checkpoint-dir",
            str(ckpts),
            "--",
            sys.executable,
            str(SCRIPT),
            str(first),
            "",
            *CASES,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "SPARSE_STEP_S": "0.15"},
        start_new_session=True,
    )
    kill_after_a_checkpoint(proc, ckpts, log)
    assert not (first / "stats.json").exists(), "the job ended before it was killed"
    clock = json.loads((find_checkpoint(ckpts) / MANIFEST).read_text())["clock"]
    assert 4 <= clock < STEPS, clock  # within the first case: the second never started

    second = tmp_path / "second"
    second.mkdir()
    config = LaunchConfig(
        workers=2, servers=2, checkpoint=CheckpointSettings(resume=str(ckpts)), deadline_s=100.0
    )
    lines: list[str] = []
    job = Job(
        dataclasses.replace(config),
        [sys.executable, str(SCRIPT), str(second), "", *CASES],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
    )
    assert job.run() == 0, "\n".join(lines[-60:])
    for case in CASES:
        expected = reference(case.split(":")[0], server=True)
        for rank in range(2):
            got = torch.load(second / case.replace(":", "-") / f"rank{rank}.pt")
            assert max_difference(got, expected) < 1e-5, (case, rank)
    assert processes_of(config.job) == []
