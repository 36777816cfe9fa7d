"""Worker script of the server-death test (run by ``trimtab run --replicas 1``).

Usage: replica_worker.py OPTIMIZER BATCH_SIZES(comma-separated) OUT_DIR KILL_AFTER[,...]

After each step of KILL_AFTER (the n-th, from 0), rank 0 writes OUT_DIR/kill<n> and
waits for OUT_DIR/killed<n>: the test SIGKILLs a server meanwhile, while the other
workers' pushes of the next step are in flight. With REPLICA_NOWAIT=1 it goes on at
once instead, every worker pausing 50 ms after each step, so that the kill lands while
rounds and their replications are in flight. Each worker saves its final parameters;
rank 0 the servers' counters.
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
from tests.equivalence_job import Setup, settled_stats, train_worker

optimizer, sizes, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
kills = [int(k) for k in sys.argv[4].split(",") if k]
nowait = os.environ.get("REPLICA_NOWAIT") == "1"
trimtab.init()
setup = Setup(optimizer, tuple(int(s) for s in sizes.split(",")))


done_at: list[float] = []  # when each step ended (time.time(): the test compares)


def on_step(step: int) -> None:
    done_at.append(time.time())
    if nowait:
        time.sleep(0.05)
    if trimtab.rank() != 0 or step not in kills:
        return
    n = kills.index(step)
    (out / f"kill{n}").write_text(str(step))
    if nowait:
        return
    deadline = time.monotonic() + 60
    while not (out / f"killed{n}").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no server was killed")
        time.sleep(0.01)


params = train_worker(setup, trimtab.rank(), on_step=on_step)
torch.save(params, out / f"rank{trimtab.rank()}.pt")
(out / f"steps{trimtab.rank()}.json").write_text(json.dumps(done_at))
trimtab.barrier()  # every worker's last step is applied everywhere
if trimtab.rank() == 0:
    (out / "stats.json").write_text(json.dumps(settled_stats()))
trimtab.shutdown()
