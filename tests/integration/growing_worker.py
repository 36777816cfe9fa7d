"""Worker script of the growing-table test (run by ``trimtab run``).

Usage: growing_worker.py OUT_DIR

Trains a ``trimtab.nn.EmbeddingBag`` that grows (tests/growing_job.py) over its
schedule, saving each step's ids and the rows read as OUT_DIR/rank<r>.pt, the table's
report, and (rank 0) the servers' counters as OUT_DIR/stats.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
import trimtab.nn
from tests.growing_job import DIM, ROWS, SCHEDULE, SEED, growth

out = Path(sys.argv[1])
trimtab.init()
table = trimtab.nn.EmbeddingBag(ROWS, DIM, mode="sum", seed=SEED, growing=growth())
opt = trimtab.DistributedOptimizer(
    torch.optim.SGD(table.parameters(), lr=0.5), table.named_parameters()
)
g = torch.Generator().manual_seed(3)
reads = []
for ids in SCHEDULE:
    keys = torch.tensor(sorted(ids))
    opt.zero_grad()
    rows = table(keys, torch.arange(keys.numel()))
    reads.append((keys, rows.detach().clone()))
    (rows * torch.randn(rows.shape, generator=g)).sum().backward()
    opt.step()
trimtab.barrier()
torch.save({"reads": reads, "report": table.growth_report()}, out / f"rank{trimtab.rank()}.pt")
if trimtab.rank() == 0:
    (out / "stats.json").write_text(json.dumps(trimtab.server_stats()))
trimtab.barrier()
trimtab.shutdown()
