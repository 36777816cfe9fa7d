"""``trimtab experiment sparse --json`` runs end to end (small tables): every run's
held-out log loss is one process's (they train the same model on the same batches),
and the JSON has what BENCHMARKS.md reads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("consistency", ["bsp", "ssp"])
def test_the_sparse_experiment_reports_every_run(consistency: str) -> None:
    """(ssp: the BSP runs and, beside them, hot and classic under SSP with a bound of 2:
    their log loss within 0.005 of one process, the replicas serving reads, never read
    afresh: the answers bring every change.)"""
    cli = "import sys, trimtab.cli; sys.exit(trimtab.cli.main())"
    args = ["experiment", "sparse", "--rows", "20000", "--steps", "12", "--hot", "200"]
    args += ["--consistency", consistency, "--staleness", "2"]
    command = [sys.executable, "-c", cli, *args, "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=280, check=True).stdout
    report = json.loads(out[out.index("{") :])
    one = report["one_process_log_loss"]
    runs = ("hot", "classic", "ddp") + (("hot_ssp", "classic_ssp") if consistency == "ssp" else ())
    assert sorted(report["results"]) == sorted(runs)
    for run in runs:
        result = report["results"][run]
        assert result["samples_per_s"] > 0
        assert abs(result["log_loss"] - one) < 0.005, (run, result, one)
        assert len(result["peak_rss_mb"]) == 2
    assert report["results"]["hot"]["hot"]["rows"] > 0
    if consistency == "ssp":
        # The replicas follow every update through the pushes' answers: never read afresh.
        hot_ssp = report["results"]["hot_ssp"]["hot"]
        assert hot_ssp["max_age"] == 0 and hot_ssp["hit_rate"] > 0  # (served reads)
