"""Worker script of the multi-process equivalence test (run by ``trimtab run``).

Usage: equiv_worker.py OPTIMIZER BATCH_SIZES(comma-separated) OUT_DIR
   or: equiv_worker.py --cases OUT_DIR CASE [CASE ...]

where CASE is ``OPTIMIZER:BATCH_SIZES[:overlap]`` (``overlap``: the forward waits per
module, ``DistributedOptimizer(model=...)``). The second form runs each case in turn in
one job, each with a model and an optimizer of its own (a table of its own), and writes
a case's files in ``OUT_DIR/NAME``, NAME being CASE with ``-`` for ``:`` and ``x`` for
``,`` (``sgd:5,19:overlap``: ``sgd-5x19-overlap``). Each rank saves its final
parameters as ``rank{r}.pt`` and the batch sizes it used as ``sizes{r}.pt``; rank 0
saves the servers' counters and the job's status, once, as ``OUT_DIR/stats.json``.
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
import trimtab.frontend.api
from tests.equivalence_job import Setup, settled_stats, train_worker
from trimtab.protocol.messages import Control

hidden = int(os.environ.get("EQUIV_HIDDEN", "32"))  # 192: chunks too big for a header


def setup_of(optimizer: str, sizes: str, *flags: str) -> Setup:
    batch_sizes = tuple(int(s) for s in sizes.split(","))
    return Setup(optimizer, batch_sizes, overlap="overlap" in flags, hidden=hidden)


if sys.argv[1] == "--cases":
    out = Path(sys.argv[2])
    cases = [
        (setup_of(*case.split(":")), out / case.replace(":", "-").replace(",", "x"))
        for case in sys.argv[3:]
    ]
else:
    out = Path(sys.argv[3])
    cases = [(setup_of(sys.argv[1], sys.argv[2]), out)]
trimtab.init()
# EQUIV_SCALE="7:3,14:2": after step 7 rank 0 asks for 3 servers, after 14 for 2. For a
# server to add, it waits until the new server has joined (the launcher starts it), so
# that the change lands mid-run; the chunks then move while training goes on.
plan = dict(
    (int(a), int(b))
    for a, b in (x.split(":") for x in os.environ.get("EQUIV_SCALE", "").split(",") if x)
)


# EQUIV_STEP_S=0.1: each step takes at least that long (a job to checkpoint mid-run).
step_s = float(os.environ.get("EQUIV_STEP_S", "0"))


def on_step(step: int) -> None:
    time.sleep(step_s)
    if trimtab.rank() != 0 or step not in plan:
        return
    trimtab.frontend.api.default_context().call({"o": int(Control.SCALE), "servers": plan[step]})
    deadline = time.monotonic() + 60
    while len(trimtab.job_status()["active_servers"]) != plan[step]:
        if time.monotonic() > deadline:
            raise SystemExit(f"the job did not reach {plan[step]} servers")
        time.sleep(0.05)


for setup, where in cases:
    where.mkdir(exist_ok=True)
    used: list[tuple[int, ...]] = []
    params = train_worker(setup, trimtab.rank(), sizes_out=used, on_step=on_step)
    torch.save(params, where / f"rank{trimtab.rank()}.pt")
    torch.save(used, where / f"sizes{trimtab.rank()}.pt")
trimtab.barrier()  # every worker's last step is applied everywhere
if trimtab.rank() == 0:
    stats = settled_stats()
    (out / "stats.json").write_text(json.dumps(stats))
trimtab.shutdown()
