"""Worker script of the broadcast-across-failover test (run by ``trimtab run`` with 3
workers): rank 0 broadcasts its values (tensors no optimizer holds: no adoption
follows); rank 1 takes them and asks the test to kill
the coordinator (OUT/kill0); rank 2 calls the broadcast only once the coordinator was
replaced (OUT/killed0). Each worker's values after it go to ``OUT/rank{r}.pt``, and
one training step follows (the job goes on under the replacement).

Usage: broadcast_failover_worker.py OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import trimtab

out = Path(sys.argv[1])
trimtab.init()
rank = trimtab.rank()
torch.manual_seed(rank)  # each worker starts from its own values: the root's must win
model = torch.nn.Linear(6, 3)
optimizer = trimtab.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
if rank == 2:  # the broadcast reaches the replacement coordinator only
    deadline = time.monotonic() + 60
    while not (out / "killed0").exists():
        assert time.monotonic() < deadline, "the coordinator was not replaced in 60 s"
        time.sleep(0.02)
values = {"w": torch.randn(5), "b": torch.randn(2, 3)}  # (seeded by rank: differ)
trimtab.broadcast_parameters(values, root_rank=0)
torch.save(values, out / f"rank{rank}.pt")
if rank == 1:  # took the value from the first coordinator
    (out / "kill0").write_text("1")
optimizer.zero_grad()
model(torch.ones(4, 6)).sum().backward()
optimizer.step()
trimtab.shutdown()
