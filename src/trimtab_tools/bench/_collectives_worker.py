"""Worker script of ``trimtab bench collectives``: times scalar allreduces (Horovod's
``hvd.allreduce(loss)`` once per step) and, for the floor of one round trip through the
coordinator, barriers. Rank 0 prints one result line after a marker."""

from __future__ import annotations

import argparse
import json
import time

import torch

import trimtab
from trimtab_tools.bench.markers import RESULT


def _timed(call: object, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    trimtab.init()
    scalar = torch.tensor(float(trimtab.rank() + 1))
    expected = trimtab.size() * (trimtab.size() + 1) / 2

    def allreduce() -> None:
        if trimtab.allreduce(scalar, op=trimtab.Sum).item() != expected:
            raise SystemExit("allreduce produced a wrong sum")

    _timed(allreduce, args.warmup)
    times = _timed(allreduce, args.count)
    barriers = _timed(trimtab.barrier, args.count)
    if trimtab.rank() == 0:
        print(RESULT + json.dumps({"times": times, "barrier_times": barriers}), flush=True)
    trimtab.shutdown()


if __name__ == "__main__":
    main()
