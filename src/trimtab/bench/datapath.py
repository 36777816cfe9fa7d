"""``trimtab bench datapath``: trimtab's push+pull step against the machine's limits.

In one run it measures, for the same bytes:
  * trimtab: 2 workers x 2 servers, each step pushes every tensor's gradient and
    receives the updated values (real processes, real sockets, the real optimizer path);
  * the loopback TCP ceiling: raw socket transfer between two processes;
  * torch.distributed gloo allreduce of the same tensors with 2 processes.
``floor_step_s`` = 4 x model bytes / ceiling: the bytes a PS step moves through loopback
(2 workers each push and pull the model once).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from trimtab._launcher import Job, LaunchConfig
from trimtab.bench._datapath_worker import RESULT
from trimtab.bench.baselines import gloo_allreduce_s, tcp_ceiling_gbps

MIB = 1 << 20


def model_sizes(total_mib: int) -> list[int]:
    """Tensor sizes in bytes, 1 to 25 MiB, summing to ``total_mib`` MiB."""
    pattern = [25, 20, 16, 12, 10, 8, 5, 2, 1, 1]
    sizes: list[int] = []
    left = total_mib
    while left > 0:
        for mib in pattern:
            take = min(mib, left)
            if take > 0:
                sizes.append(take * MIB)
                left -= take
    return sizes


def run_trimtab(
    sizes: list[int], steps: int, chunk_bytes: int, workers: int = 2, servers: int = 2
) -> list[float]:
    """Per-step seconds of trimtab on rank 0. Blocks; raises RuntimeError on failure."""
    found: list[float] = []
    log: list[str] = []

    def output(source: str, line: str) -> None:
        if line.startswith(RESULT):
            found.extend(json.loads(line[len(RESULT) :])["times"])
        else:
            log.append(f"[{source}] {line}")

    command = [
        sys.executable,
        "-m",
        "trimtab.bench._datapath_worker",
        "--sizes",
        ",".join(map(str, sizes)),
        "--steps",
        str(steps),
    ]
    config = LaunchConfig(
        workers=workers, servers=servers, chunk_bytes=chunk_bytes, placement="greedy"
    )
    status = Job(config, command, output=output).run()
    if status != 0 or not found:
        raise RuntimeError(
            f"trimtab datapath job failed (status {status}):\n" + "\n".join(log[-30:])
        )
    return found


def measure(steps: int, model_mib: int, chunk_bytes: int) -> dict[str, Any]:
    """Run all three measurements, one after the other. Blocks (about a minute)."""
    sizes = model_sizes(model_mib)
    total = sum(sizes)
    times = run_trimtab(sizes, steps, chunk_bytes)
    ceiling = tcp_ceiling_gbps(total, repeats=5)
    gloo = gloo_allreduce_s([b // 4 for b in sizes], repeats=max(5, steps // 2))
    step_s = statistics.median(times)
    floor = 4 * total / ceiling["bytes_per_s"]
    return {
        "benchmark": "datapath",
        "model_bytes": total,
        "tensors": len(sizes),
        "workers": 2,
        "servers": 2,
        "chunk_bytes": chunk_bytes,
        "steps": len(times),
        "step_s": round(step_s, 5),
        "step_p90_s": round(sorted(times)[int(0.9 * (len(times) - 1))], 5),
        "tcp_ceiling_gbps": round(ceiling["gbps"], 3),
        "floor_step_s": round(floor, 5),
        "gloo_allreduce_s": round(gloo["median_s"], 5),
        "step_over_floor": round(step_s / floor, 3),
        "step_over_gloo": round(step_s / gloo["median_s"], 3),
    }


def main(args: argparse.Namespace) -> int:
    result = measure(args.steps, args.model_mib, args.chunk_bytes)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key:>18}: {value}")
    return 0
