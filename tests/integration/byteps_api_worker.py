"""A BytePS-style training script for test_horovod_api.py (as BytePS's
tests/torch/test_pipeline.py trains): ``import trimtab as bps``, declare each gradient's
name, push_pull every gradient (average=True) after backward, then a plain SGD step on
each worker. Each worker writes its final parameters to ``OUT/rank{r}.json``.
Run under ``trimtab run --workers N --servers 1 -- python THIS OUT STEPS LR``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

import trimtab as bps
import trimtab.byteps.torch as bps_torch

DIM, BATCH = 4, 6


def main() -> None:
    out, steps, lr = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    bps.init()
    r = bps.rank()
    model = torch.nn.Linear(DIM, 1)
    with torch.no_grad():
        model.weight.copy_(torch.linspace(-0.5, 0.5, DIM).view(1, DIM))
        model.bias.zero_()
    for name, _ in model.named_parameters():
        bps.declare(f"grad.{name}")
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        rng = np.random.default_rng(1000 * step + r)
        x = torch.from_numpy(rng.standard_normal((BATCH, DIM))).float()
        y = torch.from_numpy(rng.standard_normal(BATCH)).float()
        optimizer.zero_grad()
        loss = ((model(x).squeeze(1) - y) ** 2).mean()
        loss.backward()
        handles = [
            bps.push_pull_async_inplace(p.grad, average=True, name=f"grad.{name}")
            for name, p in model.named_parameters()
            if p.grad is not None
        ]
        for handle in handles:
            bps.synchronize(handle)
        optimizer.step()
    got = {
        "weight": model.weight.detach().view(-1).double().tolist(),
        "bias": model.bias.detach().double().tolist(),
        "declared": bps_torch.declared(),
        "push_pull_sum": bps.push_pull(torch.tensor([r + 1.0]), average=False, name="sum").tolist(),
    }
    try:
        bps_torch.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), staleness=1
        )
        got["staleness"] = {}
    except bps.ConfigError as exc:
        got["staleness"] = {"type": type(exc).__name__, "msg": str(exc)}
    wrapped = bps_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr),
        named_parameters=model.named_parameters(),
        compression=bps_torch.Compression.none,
        backward_passes_per_step=1,
    )
    got["optimizer"] = type(wrapped).__name__
    (out / f"rank{r}.json").write_text(json.dumps(got))
    bps.shutdown()


if __name__ == "__main__":
    main()
