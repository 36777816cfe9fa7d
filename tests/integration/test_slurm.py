"""trimtab on a real Slurm (Debian's slurm-wlm 22.05) in the test bed: two nodes, each
a bed host. ``sbatch`` of the documented script (docs/slurm/trimtab.sbatch) runs the
example job to the local run's accuracy, and ``trimtab run --backend slurm`` submits
the job itself (salloc) and places the roles as job steps on both nodes. Nothing is
left running after either. The slow tier: the daemons take seconds to start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import processes_of
from tests.slurmcluster import SlurmCluster, slurm_cluster  # noqa: F401 (a fixture)
from trimtab.examples.markers import RESULT
from trimtab.launch.job import Job, LaunchConfig

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = [sys.executable, "-m", "trimtab.examples.digits", "--epochs", "4"]
JOB = re.compile(r"\[trimtab\] job (\S+) in Slurm job")
PLACED = re.compile(r"\[trimtab\] (coordinator|server \d+|worker \d+) runs on (\S+)$")


def _accuracy(lines: list[str]) -> float:
    """The example's test accuracy from its result line (rank 0's)."""
    for line in lines:
        at = line.find(RESULT)
        if at >= 0:
            return float(json.loads(line[at + len(RESULT) :])["test_accuracy"])
    raise AssertionError("no result line:\n" + "\n".join(lines[-60:]))


@pytest.fixture(scope="module")
def local_accuracy() -> float:
    """The example's accuracy run locally (2 workers, 1 server): BSP makes it one
    process's, whatever the number of workers or where they run."""
    lines: list[str] = []
    config = LaunchConfig(workers=2, servers=1, deadline_s=200)
    status = Job(config, EXAMPLE, output=lambda s, line: lines.append(line)).run()
    assert status == 0, "\n".join(lines[-40:])
    return _accuracy(lines)


def _quiet(cluster: SlurmCluster, job: str) -> None:
    """Nothing of the job left: no Slurm job queued or running, no process."""
    assert cluster.run(["squeue", "-h"]).strip() == ""
    assert processes_of(job) == []


@pytest.mark.timeout(400)
def test_sbatch_of_the_documented_script_reaches_the_local_accuracy(
    slurm_cluster: SlurmCluster,  # noqa: F811
    local_accuracy: float,
    tmp_path: Path,
) -> None:
    cluster = slurm_cluster
    script = ROOT / "docs" / "slurm" / "trimtab.sbatch"
    job = "slurmjob1"
    cluster.env["TRIMTAB_JOB"] = job
    try:
        cluster.run(
            ["sbatch", "--wait", "--nodes=2", "--ntasks=4", f"--chdir={tmp_path}",
             str(script), *EXAMPLE],
            timeout=300,
        )  # fmt: skip
    finally:
        del cluster.env["TRIMTAB_JOB"]
    [out] = tmp_path.glob("trimtab-*.out")
    lines = out.read_text().splitlines()
    assert abs(_accuracy(lines) - local_accuracy) < 0.01, "\n".join(lines[-40:])
    assert not list(tmp_path.glob(".trimtab-secret-*"))  # the script removed it
    _quiet(cluster, job)


@pytest.mark.timeout(400)
def test_trimtab_run_backend_slurm_submits_and_places_steps_on_both_nodes(
    slurm_cluster: SlurmCluster,  # noqa: F811
    local_accuracy: float,
    tmp_path: Path,
) -> None:
    cluster = slurm_cluster
    argv = [sys.executable, "-m", "trimtab", "run", "--backend", "slurm", "--nodes", "2",
            "-w", "2", "-s", "1", "--deadline", "250", "--", *EXAMPLE]  # fmt: skip
    done = subprocess.run(
        cluster.on(0, argv), env=cluster.env, capture_output=True, text=True, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0, "\n".join(lines[-60:])
    placed = {m.group(1): m.group(2) for m in map(PLACED.search, lines) if m}
    assert set(placed.values()) == {h.address for h in cluster.bed.hosts}, placed
    assert abs(_accuracy(lines) - local_accuracy) < 0.01
    [job] = [m.group(1) for m in map(JOB.search, lines) if m]
    _quiet(cluster, job)
    # The secret's directory is gone; the run record (runs/, the job's output) stays.
    assert [name for name in os.listdir(tmp_path) if name != "runs"] == []
