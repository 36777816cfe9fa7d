"""Worker script of the re-init test (run by ``trimtab run``): trains some steps, calls
``trimtab.shutdown()`` and ``trimtab.init()`` (if its rank is in REINIT_RANKS), builds a
new DistributedOptimizer over the same model, trains the rest, saves its parameters.

Usage: reinit_worker.py OPTIMIZER BATCH_SIZES(comma-separated) REINIT_RANKS OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
from tests.equivalence_job import global_batches, loss_of, make_model, make_optimizer

STEPS, FIRST, LR_DROP_AT = 8, 4, 6  # the learning rate drops after the re-init

optimizer, sizes_arg, ranks_arg, out = sys.argv[1:5]
sizes = [int(s) for s in sizes_arg.split(",")]
again = {int(r) for r in ranks_arg.split(",")}
trimtab.init()
rank = trimtab.rank()
model = make_model(42 if rank == 0 else 1000 + rank)


def build() -> trimtab.DistributedOptimizer:
    return trimtab.DistributedOptimizer(make_optimizer(optimizer, model), model.named_parameters())


def train(opt: trimtab.DistributedOptimizer, steps: range) -> None:
    batches = global_batches(STEPS)
    start = sum(sizes[:rank])
    for step in steps:
        if step == LR_DROP_AT:
            for group in opt.param_groups:
                group["lr"] *= 0.3
        x, y = batches[step]
        opt.batch_size = sizes[rank]
        opt.zero_grad()
        loss_of(model, x[start : start + sizes[rank]], y[start : start + sizes[rank]]).backward()
        opt.step()


opt = build()
train(opt, range(FIRST))
seen: dict[str, object] = {}
if rank in again:
    trimtab.shutdown()
    seen["initialized_after_shutdown"] = trimtab.is_initialized()
    trimtab.init()
    trimtab.init()  # a second init() changes nothing
    seen["rank_after_init"] = trimtab.rank()
    opt = build()  # over the same model: goes on from the servers' values and state
seen["clock"] = opt.clock
train(opt, range(FIRST, STEPS))
seen["final_clock"] = opt.clock
torch.save([p.detach().clone() for p in model.parameters()], Path(out) / f"rank{rank}.pt")
(Path(out) / f"seen{rank}.json").write_text(json.dumps(seen))
trimtab.shutdown()  # the usual end: the job ends once every worker's process exits
