"""``trimtab bench collectives``: what one small collective costs. 2 workers (1 server,
unused) run ``--count`` scalar ``trimtab.allreduce`` calls (Sum of one float32, the
metric a Horovod script averages every step) after ``--warmup`` untimed ones, then as
many barriers: the bare round trip through the coordinator that every collective makes,
so ``allreduce_over_barrier`` is what the gather and the reduction add to it.
Medians and p90s in microseconds, as rank 0 measured them."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from trimtab.launch.job import LaunchConfig
from trimtab_tools.bench.job import run_timed_job

WORKER = "trimtab_tools.bench._collectives_worker"


def _us(times: list[float], q: float) -> float:
    return round(sorted(times)[int(q * (len(times) - 1))] * 1e6, 1)


def measure(count: int, warmup: int, workers: int = 2) -> dict[str, Any]:
    """Run the job; return its figures. Blocks; raises RuntimeError if the job fails."""
    info: dict[str, Any] = {}
    command = [sys.executable, "-m", WORKER, "--count", str(count), "--warmup", str(warmup)]
    times = run_timed_job(LaunchConfig(workers=workers, servers=1), command, info=info)
    barriers: list[float] = info["barrier_times"]
    return {
        "benchmark": "collectives",
        "workers": workers,
        "count": len(times),
        "allreduce_scalar_median_us": _us(times, 0.5),
        "allreduce_scalar_p90_us": _us(times, 0.9),
        "barrier_median_us": _us(barriers, 0.5),
        "barrier_p90_us": _us(barriers, 0.9),
        "allreduce_over_barrier": round(statistics.median(times) / statistics.median(barriers), 3),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``trimtab bench collectives``."""
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--count", type=int, default=1000, help="timed allreduces (1000)")
    p.add_argument("--warmup", type=int, default=100, help="untimed allreduces first (100)")
    p.add_argument("--workers", type=int, default=2, help="workers (2)")


def main(args: argparse.Namespace) -> int:
    if args.count < 1 or args.warmup < 0 or args.workers < 1:
        say = "trimtab bench collectives: --count and --workers >= 1, --warmup >= 0"
        print(say, file=sys.stderr)
        return 2
    result = measure(args.count, args.warmup, args.workers)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0
