"""Worker script of ``trimtab experiment stragglers`` (trimtab modes).

Trains the digits CNN with real compute; rank 0 evaluates now and then; every rank
prints one result line after a marker.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

import trimtab
from trimtab.data import BalancedSampler
from trimtab.examples.digits import load_digits, make_cnn
from trimtab_tools.experiments.markers import STRAGGLERS_RESULT as RESULT


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean().item())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True, help="global batch")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument(
        "--sample-ms",
        type=float,
        default=0.0,
        help="emulated compute per sample, added to the real compute",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    trimtab.init()
    rank, size = trimtab.rank(), trimtab.size()
    x_train, y_train, x_test, y_test = load_digits()
    model = make_cnn(seed=0)
    optimizer = trimtab.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    sampler = BalancedSampler(len(x_train), args.batch, optimizer, rank, size, seed=11)
    trimtab.barrier()
    start = time.perf_counter()
    evals: list[tuple[float, int, float]] = []
    steps, step_times, speeds, sizes = 0, [], [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for idx in sampler:
            t0 = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x_train[idx]), y_train[idx]).backward()  # type: ignore[no-untyped-call]
            time.sleep(args.sample_ms * len(idx) / 1000)  # emulated part of the compute
            optimizer.step()
            step_times.append(time.perf_counter() - t0)
            speeds.append(len(idx) / max(optimizer.last_compute_s, 1e-9))
            sizes.append(len(idx))
            steps += 1
            if rank == 0 and steps % args.eval_every == 0:
                evals.append((time.perf_counter() - start, steps, accuracy(model, x_test, y_test)))
    train_s = time.perf_counter() - start
    trimtab.barrier()  # every worker's last update is in
    optimizer.refresh()
    final = accuracy(model, x_test, y_test)
    result = {
        "rank": rank,
        "steps": steps,
        "train_s": train_s,
        "step_times": step_times,
        "speeds": speeds,
        "sizes": sizes,
        "skipped": optimizer.skipped,
        "final_accuracy": final,
    }
    if rank == 0:
        stats = trimtab.server_stats()
        result.update(
            evals=evals,
            dropped=sum(s["dropped"] for s in stats),
            discounted=sum(s["discounted"] for s in stats),
        )
    print(RESULT + json.dumps(result), flush=True)
    trimtab.shutdown()


if __name__ == "__main__":
    main()
