"""Worker script of ``trimtab bench datapath``: times push+pull steps of a synthetic model.

Every step each worker hands the servers a gradient for every tensor (as backward would)
and waits for the updated values (plain SGD on the servers): the whole real path.
Rank 0 prints one result line after a marker.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import trimtab

RESULT = "TRIMTAB_BENCH "


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="comma-separated tensor sizes in bytes")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    trimtab.init()
    params = [torch.nn.Parameter(torch.zeros(int(b) // 4)) for b in args.sizes.split(",")]
    grads = [torch.full_like(p, 1e-3) for p in params]
    optimizer = trimtab.DistributedOptimizer(
        torch.optim.SGD(params, lr=0.1),
        named_parameters=[(f"t{i}", p) for i, p in enumerate(params)],
    )
    times = []
    for step in range(args.warmup + args.steps):
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        start = time.perf_counter()
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    # The update must have happened: every element moved by lr * mean gradient per step.
    expected = -0.1 * 1e-3 * (args.warmup + args.steps)
    if abs(params[0][0].item() - expected) > 1e-6:
        raise SystemExit(f"datapath produced wrong values: {params[0][0].item()} != {expected}")
    if trimtab.rank() == 0:
        print(RESULT + json.dumps({"times": times}), flush=True)
    trimtab.shutdown()


if __name__ == "__main__":
    main()
