"""Worker script of the role-attack tests (run by ``trimtab run``).

Usage: attack_worker.py OUT_DIR ATTACK_AT

After step ATTACK_AT, rank 0 writes what an attacker would learn of the job
(``job.json``: the job id, the coordinator, the servers, the chunks and their owners,
the clock) and waits for ``OUT_DIR/go``; meanwhile the other worker waits for it in its
next step. At the end each worker saves its parameters, and rank 0 the servers'
counters and the job's status (``stats.json``).
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
from tests.equivalence_job import Setup, train_worker

out, attack_at = Path(sys.argv[1]), int(sys.argv[2])
trimtab.init()
setup = Setup("adam", (12, 12), hidden=192)  # chunks too big for a header: shared memory


def on_step(step: int) -> None:
    if trimtab.rank() != 0 or step != attack_at:
        return
    ctx = trimtab.frontend.api.default_context()
    assert ctx.placement is not None
    owners = ctx.placement.owners
    job = {
        "job": ctx.config.job,
        "coordinator": ctx.config.coordinator,
        "servers": list(ctx.placement.servers),
        "epoch": ctx.placement.epoch,
        "clock": step + 1,
        "chunks": [[c.id, c.numel, c.dtype, owners[c.id]] for c in ctx.chunks],
        # The insider holds the job's secret (it passes the transport), not a role.
        "secret_file": os.environ["TRIMTAB_SECRET_FILE"],
    }
    tmp = out / "job.tmp"
    tmp.write_text(json.dumps(job))
    tmp.rename(out / "job.json")
    deadline = time.monotonic() + 120
    while not (out / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("the test never said go")
        time.sleep(0.05)


params = train_worker(setup, trimtab.rank(), on_step=on_step)
torch.save(params, out / f"rank{trimtab.rank()}.pt")
trimtab.barrier()
if trimtab.rank() == 0:
    stats = {"servers": trimtab.server_stats(), "job": trimtab.job_status()}
    (out / "stats.json").write_text(json.dumps(stats))
trimtab.shutdown()
