"""Worker script of ``trimtab experiment faults`` and ``soak`` (run by ``trimtab run``).

Usage: _faults_worker.py OUT_DIR STEPS [STEP_SLEEP_S] [HIDDEN]

Trains :mod:`~trimtab_tools.experiments.samples`' model under BSP until its clock reaches
STEPS, each step on its share of a global batch of 64 (``BalancedSampler``), logging
what it processed (:class:`~trimtab_tools.experiments.samples.SampleLog`). A worker that
joins later starts at the job's clock. The last rank-0 worker writes ``final.json``:
its parameters, its clock and the servers' per-chunk versions.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import trimtab
from trimtab.data import BalancedSampler
from trimtab.frontend.api import default_context
from trimtab_tools.experiments.samples import (
    SAMPLES,
    SampleLog,
    dataset,
    loss_of,
    make_model,
    make_optimizer,
)

GLOBAL_BATCH = 64


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    hidden = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    trimtab.init()
    rank = trimtab.rank()
    x, y = dataset()
    model = make_model(42 if rank == 0 else 1000 + rank, hidden)  # rank 0's values win
    opt = trimtab.DistributedOptimizer(make_optimizer(model), model.named_parameters())
    log = SampleLog(out, rank)
    epoch = opt.clock // (SAMPLES // GLOBAL_BATCH)
    while opt.clock < steps:
        # One sampler per epoch, over the job's workers now; it follows the job's batch
        # sizes step by step (and, where workers join, starts a joiner at the clock).
        sampler = BalancedSampler(SAMPLES, GLOBAL_BATCH, opt, rank, trimtab.size())
        sampler.set_epoch(epoch)
        for indices in sampler:
            if opt.clock >= steps:
                break
            clock = opt.clock
            log.begin(clock, indices)
            opt.zero_grad()
            loss_of(model, x[indices], y[indices]).backward()  # type: ignore[no-untyped-call]
            opt.step()
            log.done(clock)
            if pause:
                time.sleep(pause)  # steps long enough for faults to land mid-training
        epoch += 1
    log.close()
    # Every worker's last step is applied everywhere. Named: unnamed barriers are counted
    # per process, and a worker that joined mid-run starts its count at 0.
    default_context().barrier("end")
    if rank == 0:
        final = {
            "clock": opt.clock,
            "params": [p.detach().flatten().tolist() for p in model.parameters()],
            "versions": {
                str(c): v for s in trimtab.server_stats() for c, v in s["versions"].items()
            },
            "chunks": len(trimtab.job_status()["owners"]),
        }
        (out / "final.json").write_text(json.dumps(final))
    trimtab.shutdown()


if __name__ == "__main__":
    main()
