"""Worker script of the elastic-worker tests (run by ``trimtab run``): the equivalence
job's model over a data set walked by :class:`trimtab.data.BalancedSampler`, which
records each step's samples in OUT_DIR; the final parameters go to
``OUT_DIR/rank{r}.pt``.

Usage: elastic_worker.py OUT_DIR

Environment:
    ELASTIC_KILL="R:S": worker R sends itself SIGKILL as it begins step S.
    ELASTIC_GROW="S:K": after step S, worker 0 asks the job for K workers (a join).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
import trimtab.frontend.api
from tests.elastic_job import EPOCHS, GLOBAL_BATCH, dataset, lr_at
from tests.equivalence_job import loss_of, make_model, make_optimizer
from trimtab.data import BalancedSampler
from trimtab.protocol import elastic

out = Path(sys.argv[1])
kill = [int(x) for x in os.environ.get("ELASTIC_KILL", "-1:-1").split(":")]
grow = [int(x) for x in os.environ.get("ELASTIC_GROW", "-1:-1").split(":")]

trimtab.init()
rank = trimtab.rank()
x, y = dataset()
# Workers other than the root start from other values: the servers' must win (the
# root's seed, or, for a worker that joins, the current values it pulls).
model = make_model(42 if rank == 0 else 1000 + rank)
inner = make_optimizer("sgd", model)
opt = trimtab.DistributedOptimizer(inner, model.named_parameters())
start = opt.clock
if start:  # joined a running job: what it pulled, to compare with the job's values
    torch.save([p.detach().clone() for p in model.parameters()], out / f"joined{rank}.pt")
    (out / f"joined{rank}.json").write_text(json.dumps({"clock": start}))
sampler = BalancedSampler(len(x), GLOBAL_BATCH, opt, rank, trimtab.size(), seed=3, record=out)
for epoch in range(sampler.start_epoch, EPOCHS):
    sampler.set_epoch(epoch)
    for idx in sampler:
        step = opt.clock
        if [rank, step] == kill:
            os.kill(os.getpid(), signal.SIGKILL)
        for group in inner.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad()
        loss_of(model, x[idx], y[idx]).backward()
        opt.step()
        if rank == 0 and step == grow[0]:
            ctx = trimtab.frontend.api.default_context()
            ctx.call(elastic.scale_workers(workers=grow[1]))  # type: ignore[arg-type]
            # Wait until the new worker (started by the launcher) is held for the next
            # step boundary, so that it joins mid-run however slowly it started.
            deadline = time.monotonic() + 120
            while not trimtab.job_status()["joining"] and time.monotonic() < deadline:
                time.sleep(0.05)
torch.save([p.detach().clone() for p in model.parameters()], out / f"rank{rank}.pt")
trimtab.shutdown()
