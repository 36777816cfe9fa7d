"""Worker script of the sparse-gradient tests over processes (run by ``trimtab run``).

Usage: sparse_worker.py OUT_DIR KILL_AFTER[,...] CASE [CASE ...]

Trains tests/sparse_job.py's model for each CASE in turn (each its own optimizers) on
batches of 10 and 14: CASE is OPTIMIZER, or OPTIMIZER:server for a trimtab.nn table (on
the servers, its next rows prefetched after each step), OPTIMIZER:hot for the same with
40 hot rows replicated on the workers. Saves each worker's parameters
as OUT_DIR/CASE/rank<r>.pt (``-`` for ``:``).
After each step of KILL_AFTER of the first optimizer, rank 0 writes OUT_DIR/kill<n> and
waits for OUT_DIR/killed<n> (the test kills a server meanwhile). With SPARSE_STEP_S,
every step takes at least that many seconds (a job to checkpoint and kill mid-run). Rank 0 saves the
servers' counters and the job's status as OUT_DIR/stats.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab
from tests.equivalence_job import settled_stats
from tests.sparse_job import train_worker

SIZES = (10, 14)
out = Path(sys.argv[1])
kills = [int(k) for k in sys.argv[2].split(",") if k]
trimtab.init()


#: SPARSE_STEP_S=0.1: each step takes at least that long (a job to checkpoint mid-run).
step_s = float(os.environ.get("SPARSE_STEP_S", "0"))


def on_step(step: int) -> None:
    time.sleep(step_s)
    if trimtab.rank() != 0 or step not in kills:
        return
    n = kills.index(step)
    (out / f"kill{n}").write_text(str(step))
    deadline = time.monotonic() + 60
    while not (out / f"killed{n}").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no server was killed")
        time.sleep(0.01)


for i, case in enumerate(sys.argv[3:]):
    name, _, kind = case.partition(":")
    params = train_worker(
        name,
        SIZES,
        trimtab.rank(),
        on_step=on_step if i == 0 or step_s else None,
        server=kind in ("server", "hot"),
        prefetch="after" if kind in ("server", "hot") else "",
        hot=40 if kind == "hot" else 0,
    )
    (out / case.replace(":", "-")).mkdir(exist_ok=True)
    torch.save(params, out / case.replace(":", "-") / f"rank{trimtab.rank()}.pt")
trimtab.barrier()
if trimtab.rank() == 0:
    (out / "stats.json").write_text(json.dumps(settled_stats()))
trimtab.shutdown()
