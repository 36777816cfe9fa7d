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

``ideal_step_s`` = max(compute, comm): the step no overlap can beat. On a shaped bed it
is not reachable either: backward makes the first layer's gradient last, and the next
forward needs that layer's new value first, so at least its push and its value cross the
link after the compute. ``bound_step_s`` = compute + 2 x the first layer's bytes / the
link rate is that floor (``overlap_over_bound``: how close the overlap comes to it);
with few, big layers it is well above ``ideal_step_s``.

``--testbed``: each role on its own host of a test bed, every link shaped by ``tc`` to
``--rate-mbit`` (default 800), the model 32 layers of 512 x 512 (1 MiB each) in chunks
of 256 KiB unless given, so that the links, not the cores, bound communication
(:mod:`trimtab_tools.bench.bed`); unless ``--forward-ms`` is given, the emulated compute
is then sized to the measured communication (``comm``), so that the two are about
equal, as P3 is meant for. One more run there, ``overlap_no_credit``: ``model=`` and the
servers' priority, but no bound on each worker's bytes in flight
(``TRIMTAB_CREDIT_BYTES=0``): what the send side's holding back adds
(``send_side_gain``). ``overlap_fifo`` merges and sends in arrival order
(``TRIMTAB_PRIORITY=0``: the servers' order and the workers' held pushes alike).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from trimtab.launch.job import LaunchConfig
from trimtab.launch.testbed import Testbed
from trimtab_tools.bench.bed import HOSTS, shaped_bed
from trimtab_tools.bench.job import run_timed_job
from trimtab_tools.bench.markers import RESULT

WORKER = "trimtab_tools.bench._overlap_worker"


def _local(model_args: list[str]) -> list[float]:
    """The compute alone, in one process. Blocks; raises RuntimeError on failure."""
    # One torch thread, as the launcher gives the job's processes: on a busy machine
    # torch's default threads made the compute alone 6 x slower than the same compute
    # inside the job (2.84 s against 0.48 s a step at a load of 20).
    done = subprocess.run(
        [sys.executable, "-m", WORKER, "--local", *model_args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            times: list[float] = json.loads(line[len(RESULT) :])["times"]
            return times
    raise RuntimeError(f"local compute run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def measure(
    layers: int,
    width: int,
    forward_ms: float | None,
    steps: int,
    chunk_bytes: int,
    testbed: Testbed | None = None,
) -> dict[str, Any]:
    """Run the variants one after another; return medians and ratios. ``forward_ms``
    None: sized so that compute matches the measured communication. ``testbed``: the
    roles on its hosts. Blocks."""
    model_args = ["--layers", str(layers), "--width", str(width), "--steps", str(steps)]
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=chunk_bytes, placement="greedy")
    command = [sys.executable, "-m", WORKER, *model_args]
    runs: dict[str, list[float]] = {}

    def job(name: str, extra: list[str], env: dict[str, str] | None) -> None:
        print(f"trimtab bench overlap: {name} ...", file=sys.stderr, flush=True)
        runs[name] = run_timed_job(config, [*command, *extra], env=env, testbed=testbed)

    job("comm", ["--forward-ms", "0"], None)
    if forward_ms is None:  # forward + backward = 3 x forward_ms per layer
        forward_ms = round(statistics.median(runs["comm"]) * 1000 / (3 * layers), 2)
    timed = ["--forward-ms", str(forward_ms)]
    print("trimtab bench overlap: compute alone ...", file=sys.stderr, flush=True)
    runs["compute"] = _local([*model_args, *timed])
    job("sequential", timed, None)
    job("overlap_fifo", [*timed, "--overlap"], {"TRIMTAB_PRIORITY": "0"})
    if testbed is not None:
        job("overlap_no_credit", [*timed, "--overlap"], {"TRIMTAB_CREDIT_BYTES": "0"})
    job("overlap", [*timed, "--overlap"], None)
    med = {name: statistics.median(times) for name, times in runs.items()}
    ideal = max(med["compute"], med["comm"])
    extra: dict[str, Any] = {}
    if "overlap_no_credit" in med:
        extra["send_side_gain"] = round(med["overlap_no_credit"] / med["overlap"], 3)
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
        **extra,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--layers", type=int, default=None, help="linear layers (default 8; --testbed: 32)"
    )
    parser.add_argument(
        "--width", type=int, default=None, help="layer width (default 1024; --testbed: 512)"
    )
    parser.add_argument(
        "--forward-ms",
        type=float,
        default=None,
        help="emulated forward time per layer; backward is twice it (default 3; with "
        "--testbed: sized so that compute matches the measured communication)",
    )
    parser.add_argument(
        "--testbed",
        action="store_true",
        help="each role on its own host of a test bed (root), links shaped by tc",
    )
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=800.0,
        help="with --testbed: every host's link rate (default 800)",
    )
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run (median)")
    parser.add_argument(
        "--chunk-bytes",
        type=int,
        default=None,
        help="the job's chunk size (default 1 MiB; --testbed: 256 KiB)",
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark and print its figures. Blocks; returns the exit status."""
    forward_ms = args.forward_ms
    if forward_ms is None and not args.testbed:
        forward_ms = 3.0
    # On the bed, a model whose first layer is small beside the step (32 x 1 MiB: the
    # first layer's round trip bounds the step at 1.05 x ideal; 8 x 4 MiB's bound is
    # 1.18 x, above the goal), sliced as P3 slices it, so that a first layer's push or
    # value waits behind at most a quarter of a layer per link.
    bed = args.testbed
    layers = (32 if bed else 8) if args.layers is None else args.layers
    width = (512 if bed else 1024) if args.width is None else args.width
    chunk_bytes = (
        ((256 << 10) if bed else (1 << 20)) if args.chunk_bytes is None else args.chunk_bytes
    )
    if layers < 1 or width < 1 or args.steps < 3 or (forward_ms or 0) < 0:
        print(
            "trimtab bench overlap: --layers, --width need >= 1, --steps >= 3, --forward-ms >= 0",
            file=sys.stderr,
        )
        return 2
    try:
        with contextlib.ExitStack() as stack:
            bed = None
            if args.testbed:
                bed = stack.enter_context(shaped_bed(HOSTS, args.rate_mbit))
            result = measure(layers, width, forward_ms, args.steps, chunk_bytes, bed)
        if bed is not None:
            link = args.rate_mbit * 1e6 / 8  # bytes/s, each way
            first = (width * width + width) * 4
            bound = result["compute_step_s"] + 2 * first / link
            result.update(
                testbed=True,
                hosts=HOSTS,
                rate_mbit=args.rate_mbit,
                bound_step_s=round(bound, 5),
                overlap_over_bound=round(result["overlap_step_s"] / bound, 3),
            )
    except RuntimeError as exc:
        print(f"trimtab bench overlap: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>26}: {value}")
    return 0
