"""A growing table over real processes (2 servers x 2 workers, TCP): ids of any 64-bit
value get rows after two sightings, rows unseen past the time to live and rows past
the cap are given back, and an evicted id read again comes back as a new row, its
values drawn afresh. The servers' counters equal the pure policy's over the schedule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.growing_job import DIM, SEED, expected
from trimtab.launch.job import Job, LaunchConfig
from trimtab.roles.server.growing import fresh_row

SCRIPT = Path(__file__).with_name("growing_worker.py")


@pytest.mark.timeout(90)
def test_a_growing_table_admits_evicts_caps_and_gives_evicted_ids_fresh_rows(
    tmp_path: Path,
) -> None:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=64, deadline_s=60.0)
    lines: list[str] = []
    job = Job(config, [sys.executable, str(SCRIPT), str(tmp_path)],
              output=lambda src, line: lines.append(f"[{src}] {line}"))  # fmt: skip
    assert job.run() == 0, "\n".join(lines[-60:])
    assert processes_of(config.job) == []

    total, per_step = expected()
    assert total["evicted"] > 0 and total["evicted_for_cap"] > 0 and total["full"] > 0
    servers = json.loads((tmp_path / "stats.json").read_text())
    got = dict.fromkeys(total, 0)
    for s in servers:
        for k, v in s.get("growing", {}).items():
            got[k] += v
    assert got == total
    assert got["live"] <= 40

    runs = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    # Every sighting refused was a read whose gradient the worker dropped.
    assert sum(r["report"]["dropped"] for r in runs) == total["refused"]
    fresh_again = 0
    for step, seen in enumerate(per_step):
        (keys, rows0), (keys1, rows1) = runs[0]["reads"][step], runs[1]["reads"][step]
        assert torch.equal(keys, keys1)
        for i, key in enumerate(keys.tolist()):
            row, fresh = seen[key]
            pair = sorted([rows0[i], rows1[i]], key=lambda t: float(t.abs().sum()))
            if row < 0:  # refused at both reads: zeros for both workers
                assert not pair[0].any() and not pair[1].any()
            elif fresh:  # one worker's read refused it, the other's gave it a new row
                assert not pair[0].any()
                assert torch.allclose(pair[1], fresh_row(SEED, key, DIM, 0.0, 1.0))
                fresh_again += step >= 6
    assert fresh_again > 0  # ids of phase A, evicted, came back as new rows
