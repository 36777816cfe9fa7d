"""Worker script of the liveness tests (a job started by hand): trains a small model
and says what happened, one line each: ``READY`` after two steps, ``ABORTED <type>``
when it catches :class:`trimtab.JobAborted` (then ``AT <time.time()>``), ``STEP_MAX
<seconds>`` and ``FINISHED`` at the end of a job that ran its course.

Usage: liveness_worker.py MODE STEPS, MODE one of ``train`` (train, between two
``broadcast_parameters``: Horovod's at the start, and one at the end, which a job whose
coordinator was replaced meanwhile must take too), ``raise`` (rank 1 raises an uncaught
ValueError at step 2)."""

from __future__ import annotations

import sys
import time

import torch

import trimtab

mode, steps = sys.argv[1], int(sys.argv[2])
trimtab.init()
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
opt = trimtab.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters()
)
if mode == "train":
    trimtab.broadcast_parameters(model.state_dict(), root_rank=0)
longest = 0.0
try:
    for step in range(steps):
        if step == 2:
            print("READY", flush=True)
            if mode == "raise" and trimtab.rank() == 1:
                raise ValueError("boom at step 2")
        started = time.monotonic()
        opt.zero_grad()
        model(torch.ones(8, 16)).pow(2).mean().backward()
        opt.step()
        longest = max(longest, time.monotonic() - started)
        time.sleep(0.02)
    if mode == "train":
        trimtab.broadcast_parameters(model.state_dict(), root_rank=0)
except trimtab.JobAborted as exc:
    print(f"ABORTED {type(exc).__name__}: {exc}", flush=True)
    print(f"AT {time.time():.2f}", flush=True)
    sys.exit(7)
print(f"STEP_MAX {longest:.3f}", flush=True)
print("FINISHED", flush=True)
