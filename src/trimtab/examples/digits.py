"""The built-in example: an MLP on scikit-learn's bundled digits (no download).

Run as a worker script under ``trimtab run`` (``trimtab train`` does that). Rank 0
prints progress events and, at the end, one result line, each as a JSON object after a
marker, which ``trimtab train`` reads.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

import trimtab
from trimtab.data import GlobalBatchSampler
from trimtab.examples.markers import PROGRESS, RESULT


def load_digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and test tensors (80/20 split, features scaled to [0, 1]). Raises
    ImportError, saying what to install, without scikit-learn (an extra, not a
    requirement of the runtime)."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError as exc:
        raise ImportError(
            "the digits example needs scikit-learn: pip install 'trimtab[example]'"
        ) from exc

    data = sk_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def make_cnn(seed: int = 0) -> nn.Module:
    """A small CNN over the 8x8 digits: enough compute per sample (about 0.25 ms on one
    core) that a step is compute-bound, as the straggler experiments want."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 16, 10),
    )
    with torch.no_grad():  # seeded locally, the same in every process
        for p in model.parameters():
            bound = 1.0 / max(1, p[0].numel()) ** 0.5 if p.dim() > 1 else 0.05
            p.uniform_(-bound, bound, generator=g)
    return model


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args(argv)

    trimtab.init()
    torch.manual_seed(1234 + trimtab.rank())  # different on purpose: broadcast unifies
    x_train, y_train, x_test, y_test = load_digits()
    model = make_model()
    optimizer = trimtab.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum),
        named_parameters=model.named_parameters(),
    )
    first = trimtab.start_step()  # a job resumed from a checkpoint goes on from there
    if first == 0:  # (resumed, the servers hold the checkpoint's values: keep them)
        trimtab.broadcast_parameters(model.state_dict(), root_rank=0)
    sampler = GlobalBatchSampler(
        len(x_train), args.batch_size, trimtab.rank(), trimtab.size(), seed=7
    )
    optimizer.batch_size = sampler.batch_sizes[trimtab.rank()]
    total = args.epochs * len(sampler)
    lead = trimtab.rank() == 0
    if lead:
        print(PROGRESS + json.dumps({"step": 0, "total": total}), flush=True)
    start = time.perf_counter()
    steps = 0
    loss = torch.tensor(0.0)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for idx in sampler:
            if steps < first:  # done before the checkpoint
                steps += 1
                continue
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            steps += 1
            if lead and (steps % 10 == 0 or steps == total):
                print(
                    PROGRESS
                    + json.dumps({"step": steps, "total": total, "loss": round(loss.item(), 4)}),
                    flush=True,
                )
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if lead:
        # How the pushes reached the servers: shared memory and the local lane within a
        # host, TCP between hosts (the rest).
        served = trimtab.server_stats()
        paths = {k: sum(int(st[k]) for st in served) for k in ("pushes", "shared", "lane")}
        print(
            RESULT
            + json.dumps(
                {
                    "test_accuracy": round(accuracy, 4),
                    "iterations": steps,
                    "samples_per_s": round(steps * args.batch_size / elapsed, 1),
                    "train_s": round(elapsed, 3),
                    "final_loss": round(loss.item(), 4),
                    "workers": trimtab.size(),
                    "epochs": args.epochs,
                    "global_batch": args.batch_size,
                    "pushes": paths,
                }
            ),
            flush=True,
        )
    trimtab.shutdown()


if __name__ == "__main__":
    main()
