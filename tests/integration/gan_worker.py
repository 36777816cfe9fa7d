"""Worker script of the multi-process GAN test (run by ``trimtab run``): two
DistributedOptimizers, stepped alternately.

Usage: gan_worker.py GEN_OPTIMIZER DISC_OPTIMIZER BATCH_SIZES(comma-separated) OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
from tests.equivalence_job import settled_stats
from tests.gan_job import GanSetup, train_worker

gen, disc, sizes, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
trimtab.init()
setup = GanSetup(gen, disc, tuple(int(s) for s in sizes.split(",")))
params = train_worker(setup, trimtab.rank())
torch.save(params, out / f"rank{trimtab.rank()}.pt")
trimtab.barrier()  # every worker's last step is applied everywhere
if trimtab.rank() == 0:
    stats = settled_stats()
    (out / "stats.json").write_text(json.dumps(stats))
trimtab.shutdown()
