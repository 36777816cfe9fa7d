"""Worker script of ``trimtab bench overlap``: times training steps of a layered model
whose compute is emulated (a sleep per layer), with and without ``model=``.

The model is ``--layers`` linear layers of ``--width`` x ``--width`` float32; each layer
sleeps ``--forward-ms`` in its forward and twice that in its backward (the real matmuls
on a batch of 4 rows take well under a millisecond), so that what is measured is how
the data path overlaps compute, not how 2 cores share it. A step is forward, backward
and ``optimizer.step()``, timed from one forward's start to the next's. Rank 0 prints
one result line after a marker. ``--overlap`` passes ``model=`` (forward waits per
module); ``--local`` runs the compute alone, without trimtab.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from torch import nn

import trimtab
from trimtab_tools.bench.markers import RESULT


class _Sleep(torch.autograd.Function):
    """Identity whose forward and backward each take a fixed time (emulated compute)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float) -> torch.Tensor:
        ctx.backward_s = 2 * forward_s
        time.sleep(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.backward_s)
        return grad, None


class _Layer(nn.Module):
    def __init__(self, width: int, forward_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.forward_s = forward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Sleep.apply(self.linear(x), self.forward_s)  # type: ignore[no-untyped-call]
        return torch.tanh(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--forward-ms", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--overlap", action="store_true")
    parser.add_argument("--local", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(*(_Layer(args.width, args.forward_ms / 1000) for _ in range(args.layers)))
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if not args.local:
        trimtab.init()
        optimizer = trimtab.DistributedOptimizer(
            optimizer, model.named_parameters(), model=model if args.overlap else None
        )
    x = torch.randn(4, args.width)
    times = []
    last = time.perf_counter()
    for step in range(args.warmup + args.steps + 1):
        now = time.perf_counter()
        if step > args.warmup:
            times.append(now - last)
        last = now
        if step == args.warmup + args.steps:
            break
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    lead = args.local or trimtab.rank() == 0
    if not args.local:
        trimtab.barrier()
        trimtab.shutdown()
    if lead:
        print(RESULT + json.dumps({"times": times}), flush=True)


if __name__ == "__main__":
    main()
