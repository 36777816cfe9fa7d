"""Worker script of the DDP baseline of ``trimtab experiment stragglers``.

torch.distributed with gloo on 127.0.0.1: DistributedDataParallel computes each
worker's gradient under ``no_sync()`` (so that the emulated slowdown, a sleep of
(K - 1) x the measured compute, lands on compute alone, as in the trimtab runs), then
one allreduce of the flattened gradients averages them, as DDP's own hooks would.
Same model, initial values, global batches and optimizer as the trimtab runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from trimtab.data import GlobalBatchSampler
from trimtab.examples.digits import load_digits, make_cnn
from trimtab.faults.stragglers import WorkerStraggler, parse_stragglers
from trimtab_tools.experiments._stragglers_worker import accuracy
from trimtab_tools.experiments.markers import STRAGGLERS_RESULT as RESULT


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument(
        "--sample-ms",
        type=float,
        default=0.0,
        help="emulated compute per sample, added to the real compute",
    )
    parser.add_argument("--straggler", default="")
    args = parser.parse_args()

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world
    )
    rank, size = args.rank, args.world
    straggler = WorkerStraggler(parse_stragglers(args.straggler), rank)
    x_train, y_train, x_test, y_test = load_digits()
    model = nn.parallel.DistributedDataParallel(make_cnn(seed=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = GlobalBatchSampler(len(x_train), args.batch, rank, size, seed=11)
    params = [p for p in model.parameters() if p.requires_grad]
    dist.barrier()
    start = time.perf_counter()
    evals: list[tuple[float, int, float]] = []
    steps, step_times, speeds, sizes = 0, [], [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for idx in sampler:
            t0 = time.perf_counter()
            optimizer.zero_grad()
            with model.no_sync():
                nn.functional.cross_entropy(model(x_train[idx]), y_train[idx]).backward()  # type: ignore[no-untyped-call]
            time.sleep(args.sample_ms * len(idx) / 1000)  # emulated part of the compute
            compute = time.perf_counter() - t0
            straggler.on_step(steps)
            factor = straggler.factor(steps)
            if factor > 1:
                time.sleep((factor - 1) * compute)
            flat = torch.cat([p.grad.view(-1) for p in params])  # type: ignore[union-attr]
            dist.all_reduce(flat)
            flat /= size
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
                offset += n
            optimizer.step()
            step_times.append(time.perf_counter() - t0)
            speeds.append(len(idx) / (compute * factor))
            sizes.append(len(idx))
            steps += 1
            if rank == 0 and steps % args.eval_every == 0:
                evals.append(
                    (time.perf_counter() - start, steps, accuracy(model.module, x_test, y_test))
                )
    train_s = time.perf_counter() - start
    final = accuracy(model.module, x_test, y_test)
    result = {
        "rank": rank,
        "steps": steps,
        "train_s": train_s,
        "step_times": step_times,
        "speeds": speeds,
        "sizes": sizes,
        "skipped": 0,
        "final_accuracy": final,
    }
    if rank == 0:
        result.update(evals=evals, dropped=0, discounted=0)
    print(RESULT + json.dumps(result), flush=True)
    straggler.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
