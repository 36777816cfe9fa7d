"""Worker script of ``trimtab experiment psld``: the real data path, emulated compute.

Each step every worker sleeps ``--compute-ms`` (its emulated forward and backward),
hands the servers a gradient for every tensor and waits for the updated values. Rank 0
prints one result line after a marker, with its step times and the coordinator's
migration counters.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import trimtab
from trimtab.frontend.api import default_context
from trimtab_tools.experiments.markers import PSLD_RESULT as RESULT


def placement_epoch() -> int:
    """The epoch of the placement map this worker routes by."""
    placement = default_context().placement
    return placement.epoch if placement is not None else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="comma-separated tensor sizes in bytes")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    args = parser.parse_args()

    trimtab.init()
    params = [torch.nn.Parameter(torch.zeros(int(b) // 4)) for b in args.sizes.split(",")]
    grads = [torch.full_like(p, 1e-3) for p in params]
    optimizer = trimtab.DistributedOptimizer(
        torch.optim.SGD(params, lr=0.1),
        named_parameters=[(f"t{i}", p) for i, p in enumerate(params)],
    )
    times, epochs = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        time.sleep(args.compute_ms / 1000)  # emulated compute
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        optimizer.step()
        times.append(time.perf_counter() - start)
        # The map this worker routes by (not state_dict()'s, which read the optimizer
        # state off the servers: a round trip per chunk between steps, and after a
        # migration one "moved" per chunk, all outside the timed step).
        epochs.append(placement_epoch())
    # Every update applied exactly once, wherever the chunks were: lr * grad per step.
    expected = -0.1 * 1e-3 * args.steps
    for p in params:
        if abs(p[0].item() - expected) > 1e-6 or abs(p[-1].item() - expected) > 1e-6:
            raise SystemExit(f"wrong values after migrations: {p[0].item()} != {expected}")
    trimtab.barrier()
    if trimtab.rank() == 0:
        status = trimtab.job_status()
        print(
            RESULT
            + json.dumps(
                {
                    "times": times,
                    "epochs": epochs,
                    "migrations": status["migrations"],
                    "bytes_moved": status["bytes_moved"],
                    "servers": len(status["active_servers"]),
                }
            ),
            flush=True,
        )
    trimtab.shutdown()


if __name__ == "__main__":
    main()
