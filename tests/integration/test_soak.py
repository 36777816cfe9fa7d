"""``trimtab experiment soak --minutes 1``: random kills, joins and forced migrations for
a minute, run as a user would, and what must hold whether or not the job recovers
from them: faults really injected, every process of every job gone after it, a reason
for each job that did not finish, and no lost update and equivalent parameters in each
job whose servers could be asked at its end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(180)
def test_one_minute_soak() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trimtab", "experiment", "soak", "--minutes", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    soak = json.loads(out.stdout.strip().splitlines()[-1])
    assert soak["jobs"] >= 1
    # Forced migrations ran beside the replicas (they move roles), none dropped.
    assert soak["notes"] == [], soak["notes"]
    assert all(job["rebalance_every"] for job in soak["runs"])
    assert soak["faults_injected"] >= 1
    assert soak["leaked_processes"] == 0
    assert soak["rss_mb"] and all(mb >= 0 for _, mb in soak["rss_mb"])
    assert max(mb for _, mb in soak["rss_mb"]) > 0
    for job in soak["runs"]:
        assert job["completed"] or job["reason"]
        if job["lost_updates"] is not None:
            assert job["lost_updates"] == 0, job
        if job["completed"] and not job.get("note"):  # a mid-push death: see faultjob
            assert job["equivalent"], job
