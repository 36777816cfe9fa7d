"""Worker script of the multi-process equivalence test (run by ``trimtab run``).

Usage: equiv_worker.py OPTIMIZER BATCH_SIZES(comma-separated) OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
from tests.equivalence_job import Setup, train_worker

optimizer, sizes, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
trimtab.init()
setup = Setup(optimizer, tuple(int(s) for s in sizes.split(",")))
used: list[tuple[int, ...]] = []
params = train_worker(setup, trimtab.rank(), sizes_out=used)
torch.save(params, out / f"rank{trimtab.rank()}.pt")
torch.save(used, out / f"sizes{trimtab.rank()}.pt")
trimtab.barrier()  # every worker's last step is applied everywhere
if trimtab.rank() == 0:
    stats = {"servers": trimtab.server_stats(), "job": trimtab.job_status()}
    (out / "stats.json").write_text(json.dumps(stats))
trimtab.shutdown()
