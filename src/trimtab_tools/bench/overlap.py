"""``trimtab bench overlap``: does the next forward overlap the step's communication?

A model of ``--layers`` linear layers (``--width`` x ``--width`` float32 each) trains on
2 workers x 2 servers; its compute is **emulated** (each layer sleeps ``--forward-ms``
in forward and twice that in backward, see ``_overlap_worker.py``), so that the figure
is the data path's overlap, not 2 cores' contention. In one run, side by side:

  * ``compute``: the same steps in one process without trimtab (the compute alone);
  * ``comm``: trimtab steps with no emulated compute (the data path alone);
  * ``sequential``: trimtab, ``step()`` waits for every value (Horovod's contract);
  * ``overlap_fifo``: ``DistributedOptimizer(model=...)``, servers merge in arrival order;
  * ``overlap``: ``model=`` with the servers' priority (first layers first).

``ideal_step_s`` = max(compute, comm): the step no overlap can beat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from trimtab.launch.job import LaunchConfig
from trimtab_tools.bench.job import run_timed_job
from trimtab_tools.bench.markers import RESULT

WORKER = "trimtab_tools.bench._overlap_worker"


def _local(model_args: list[str]) -> list[float]:
    """The compute alone, in one process. Blocks; raises RuntimeError on failure."""
    done = subprocess.run(
        [sys.executable, "-m", WORKER, "--local", *model_args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            times: list[float] = json.loads(line[len(RESULT) :])["times"]
            return times
    raise RuntimeError(f"local compute run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def measure(
    layers: int, width: int, forward_ms: float, steps: int, chunk_bytes: int
) -> dict[str, Any]:
    """Run the five variants one after another; return medians and ratios. Blocks."""
    model_args = ["--layers", str(layers), "--width", str(width), "--steps", str(steps)]
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=chunk_bytes, placement="greedy")
    command = [sys.executable, "-m", WORKER, *model_args]
    timed = ["--forward-ms", str(forward_ms)]
    runs: dict[str, list[float]] = {}
    plan: list[tuple[str, list[str], dict[str, str] | None]] = [
        ("comm", ["--forward-ms", "0"], None),
        ("sequential", timed, None),
        ("overlap_fifo", [*timed, "--overlap"], {"TRIMTAB_PRIORITY": "0"}),
        ("overlap", [*timed, "--overlap"], None),
    ]
    print("trimtab bench overlap: compute alone ...", file=sys.stderr, flush=True)
    runs["compute"] = _local([*model_args, *timed])
    for name, extra, env in plan:
        print(f"trimtab bench overlap: {name} ...", file=sys.stderr, flush=True)
        runs[name] = run_timed_job(config, [*command, *extra], env=env)
    med = {name: statistics.median(times) for name, times in runs.items()}
    ideal = max(med["compute"], med["comm"])
    return {
        "layers": layers,
        "model_mib": round(layers * (width * width + width) * 4 / (1 << 20), 2),
        "emulated_forward_ms_per_layer": forward_ms,
        "emulated_backward_ms_per_layer": 2 * forward_ms,
        "workers": 2,
        "servers": 2,
        "chunk_bytes": chunk_bytes,
        "steps": steps,
        **{f"{name}_step_s": round(v, 5) for name, v in med.items()},
        "ideal_step_s": round(ideal, 5),
        "overlap_over_sequential": round(med["overlap"] / med["sequential"], 3),
        "overlap_over_ideal": round(med["overlap"] / ideal, 3),
        "sequential_over_ideal": round(med["sequential"] / ideal, 3),
        "priority_gain": round(med["overlap_fifo"] / med["overlap"], 3),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=8, help="linear layers (default 8)")
    parser.add_argument("--width", type=int, default=1024, help="layer width (default 1024)")
    parser.add_argument(
        "--forward-ms",
        type=float,
        default=3.0,
        help="emulated forward time per layer; backward is twice it (default 3)",
    )
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run (median)")
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark and print its figures. Blocks; returns the exit status."""
    if args.layers < 1 or args.width < 1 or args.steps < 3 or args.forward_ms < 0:
        print(
            "trimtab bench overlap: --layers, --width need >= 1, --steps >= 3, --forward-ms >= 0",
            file=sys.stderr,
        )
        return 2
    try:
        result = measure(args.layers, args.width, args.forward_ms, args.steps, args.chunk_bytes)
    except RuntimeError as exc:
        print(f"trimtab bench overlap: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>26}: {value}")
    return 0
