"""Worker script of the optimizer-state and Horovod-recipe tests (run by ``trimtab run``).

Usage: state_worker.py OPTIMIZER RECIPE FIRST LAST OUT_DIR [OP [PREDIVIDE]]

Runs steps FIRST..LAST-1 of tests/state_job.py's job. With FIRST > 0 it resumes the
way Horovod's examples do: rank 0 loads OUT_DIR/checkpoint.pt (model and optimizer),
then every rank broadcasts parameters and optimizer state. Rank 0 then saves
OUT_DIR/checkpoint.pt; every rank saves its parameters as OUT_DIR/rankR.pt. With the
recipe ``resync``, the last step calls synchronize() then step() (Horovod warns).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
from tests.equivalence_job import make_model
from tests.state_job import OPTIMIZERS, train

name, recipe, first, last, out = sys.argv[1:6]
op = sys.argv[6] if len(sys.argv) > 6 else None
predivide = float(sys.argv[7]) if len(sys.argv) > 7 else 1.0
first_step, last_step, out_dir = int(first), int(last), Path(out)
trimtab.init()
rank, size = trimtab.rank(), trimtab.size()
model = make_model(42 if rank == 0 else 1000 + rank)
opt = trimtab.DistributedOptimizer(
    OPTIMIZERS[name](model.parameters()),
    model.named_parameters(),
    op=op,
    gradient_predivide_factor=predivide,
)
checkpoint = out_dir / "checkpoint.pt"
if first_step > 0:
    if rank == 0:
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
    trimtab.broadcast_parameters(model.state_dict(), root_rank=0)
    trimtab.broadcast_optimizer_state(opt, root_rank=0)
plain = "plain" if recipe == "resync" else recipe
train(opt, model, rank, size, range(first_step, last_step - (recipe == "resync")), plain)
if recipe == "resync":  # Horovod's warned misuse: synchronize(), then a plain step()
    from tests.equivalence_job import global_batches, loss_of

    x, y = global_batches(last_step)[last_step - 1]
    share = len(x) // size
    opt.zero_grad()
    loss_of(
        model, x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
    ).backward()
    opt.synchronize()
    opt.step()
if rank == 0:
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint)
torch.save([p.detach().clone() for p in model.parameters()], out_dir / f"rank{rank}.pt")
print(f"rank {rank}: mode {opt.mode.value}", flush=True)
trimtab.barrier()
trimtab.shutdown()
