"""Worker script of the optimizer-state and Horovod-recipe tests (run by ``trimtab run``).

Usage: state_worker.py OUT_DIR CASE [CASE ...]
where CASE is ``OPTIMIZER:RECIPE:FIRST:LAST[:OP[:PREDIVIDE]]``.

Runs each case in turn, each with a model and an optimizer of its own (a table of its
own), in the directory ``OUT_DIR/OPTIMIZER-RECIPE[-OP-PREDIVIDE]``: steps FIRST..LAST-1
of tests/state_job.py's job. With FIRST > 0 it resumes the way Horovod's examples do:
rank 0 loads the case's checkpoint.pt (model and optimizer), then every rank broadcasts
parameters and optimizer state. Rank 0 then saves the case's checkpoint.pt; every rank
saves its parameters as rankR.pt there. With the recipe ``resync``, the last step calls
synchronize() then step() (Horovod warns).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
from tests.equivalence_job import global_batches, loss_of, make_model
from tests.state_job import OPTIMIZERS, train


def label(case: str) -> str:
    """The directory of a case: its fields but the steps."""
    name, recipe, _, _, *rest = case.split(":")
    return "-".join([name, recipe, *rest])


def run(case: str, out_dir: Path, rank: int, size: int) -> None:
    name, recipe, first, last, *rest = case.split(":")
    op = rest[0] if rest else None
    predivide = float(rest[1]) if len(rest) > 1 else 1.0
    first_step, last_step = int(first), int(last)
    out_dir.mkdir(exist_ok=True)
    model = make_model(42 if rank == 0 else 1000 + rank)
    opt = trimtab.DistributedOptimizer(
        OPTIMIZERS[name](model.parameters()),
        [(f"{label(case)}.{n}", p) for n, p in model.named_parameters()],
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
    print(f"rank {rank}: {label(case)} mode {opt.mode.value}", flush=True)


def main() -> None:
    out = Path(sys.argv[1])
    trimtab.init()
    rank, size = trimtab.rank(), trimtab.size()
    for case in sys.argv[2:]:
        run(case, out / label(case), rank, size)
    trimtab.barrier()
    trimtab.shutdown()


if __name__ == "__main__":
    main()
