"""``trimtab bench policies``: each policy decision alone, on inputs of a cluster's size,
timed on the wall clock (issue 38: every decision at 1,000 workers and 100 servers
under 100 ms).

The inputs are what the coordinator passes at that size: ``--workers`` workers'
histories of ``--history`` steps (one worker 4 x slower, every figure jittered), the
chunk table of a ``--model-mb`` model cut at ``--chunk-bytes``, ``--servers`` servers'
speeds with one 4 x slower. Each call runs ``--repeat`` times, on a fresh policy object
where the policy keeps state; reported per call: ``median_ms`` and ``max_ms``, and
``slowest_ms`` over all; and each call's ``max_cpu_ms``, this thread's CPU time, with
``slowest_cpu_ms`` over all (what a busy machine's other processes do not inflate).
Pure computation on this process's one thread; no I/O.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from trimtab.core.chunks import TensorSpec, make_chunks
from trimtab.policies.batching import BATCHING, WorkerSample
from trimtab.policies.detection import DEFAULT_DETECTOR, DETECTORS
from trimtab.policies.placement import PLACEMENTS
from trimtab.policies.psld import (
    PsldController,
    SpeedEstimator,
    chunk_costs,
    drain_move,
    explore_move,
    rebalance,
)
from trimtab.policies.scaling import DEFAULT_SCALING, SCALING

__all__ = ["add_arguments", "main", "measure"]

MIB = 1 << 20


def _timed(call: Callable[[], object], repeat: int) -> dict[str, float]:
    times, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        call()
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return {
        "median_ms": round(1e3 * statistics.median(times), 3),
        "max_ms": round(1e3 * max(times), 3),
        "max_cpu_ms": round(1e3 * max(cpu), 3),
    }


def _sizes(name: str, samples: dict[int, list[WorkerSample]], batch: int) -> object:
    return BATCHING.create(name).batch_sizes(samples, batch)


def measure(
    workers: int,
    servers: int,
    *,
    model_mb: float = 100.0,
    chunk_bytes: int = MIB,
    history: int = 50,
    repeat: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Time every policy call on inputs of that size (see the module). Blocks (CPU)."""
    rng = random.Random(seed)
    tensors = [
        TensorSpec(f"t{i}", (int(model_mb * MIB / 4 / 50 * (1 + i % 4) / 2.5),), "float32")
        for i in range(50)
    ]
    chunks = make_chunks(tensors, chunk_bytes)
    sizes = [c.nbytes for c in chunks]
    costs = chunk_costs(sizes, workers)
    owners = PLACEMENTS.create("greedy").place(tensors, chunks, servers)
    speeds = [rng.uniform(0.9, 1.1) * 1e9 for _ in range(servers)]
    speeds[min(3, servers - 1)] /= 4
    samples = {
        r: [
            WorkerSample(
                r,
                32,
                0.32 * (4 if r == 3 else 1) * rng.uniform(0.9, 1.1),
                rng.uniform(0.1, 0.3),
                rng.uniform(0.8, 1.0),
            )
            for _ in range(history)
        ]
        for r in range(workers)
    }
    clocks = {r: 100 - (5 if r == 3 else rng.randint(0, 1)) for r in range(workers)}
    active = [True] * servers
    out: dict[str, Any] = {}
    for name in ("hash", "mxnet", "greedy"):
        out[f"placement.{name}"] = _timed(
            functools.partial(PLACEMENTS.create(name).place, tensors, chunks, servers), repeat
        )
    out["psld.rebalance"] = _timed(lambda: rebalance(costs, owners, speeds), repeat)
    out["psld.explore_move"] = _timed(lambda: explore_move(costs, owners, speeds), repeat)
    out["psld.drain_move"] = _timed(lambda: drain_move(costs, owners, speeds), repeat)

    def decide() -> object:
        psld = PsldController(min_servers=servers)
        for k in range(10):
            psld.observe_step(k, 1.0)
        return psld.decide(10, costs, owners, speeds, active=active)

    out["psld.decide"] = _timed(decide, repeat)
    estimator = SpeedEstimator()
    for k in range(8):
        for s in range(servers):
            estimator.observe(s, 0.5 * k, 1e9 * 0.5 * k * speeds[s] / 1e9)
            estimator.observe_step(s, 2e8, 0.3, 0.1)
    out["speeds.speeds"] = _timed(lambda: estimator.speeds(servers), repeat)
    for name in ("equal", "lbbsp", "lbbsp-gpu"):
        # A fresh object each call: lbbsp-gpu keeps state between calls.
        out[f"batching.{name}"] = _timed(
            functools.partial(_sizes, name, samples, 32 * workers), repeat
        )
    out["detection.lag"] = _timed(
        lambda: DETECTORS.create(DEFAULT_DETECTOR).stragglers(clocks), repeat
    )
    scaling = SCALING.create(DEFAULT_SCALING, min_servers=servers)
    out["scaling.wants_server"] = _timed(lambda: scaling.wants_server(speeds, active), repeat)
    out["scaling.idle_server"] = _timed(
        lambda: scaling.idle_server(10, owners, active, frozenset()), repeat
    )
    slowest = max(out, key=lambda k: out[k]["max_ms"])
    return {
        "workers": workers,
        "servers": servers,
        "chunks": len(chunks),
        "history": history,
        "repeat": repeat,
        "calls": out,
        "slowest_ms": out[slowest]["max_ms"],
        "slowest": slowest,
        "slowest_cpu_ms": max(c["max_cpu_ms"] for c in out.values()),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``trimtab bench policies``' flags. Never blocks."""
    p.add_argument("--workers", "-w", type=int, default=1000, help="workers (1000)")
    p.add_argument("--servers", "-s", type=int, default=100, help="servers (100)")
    p.add_argument("--model-mb", type=float, default=100.0, help="model size, MiB (100)")
    p.add_argument("--chunk-bytes", type=int, default=MIB, help="largest chunk (1 MiB)")
    p.add_argument("--history", type=int, default=50, help="steps of history a worker (50)")
    p.add_argument("--repeat", type=int, default=5, help="calls timed each (5)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")


def main(args: argparse.Namespace) -> int:
    """Run ``trimtab bench policies``; 2 for flags out of range. Blocks (CPU, seconds)."""
    if min(args.workers, args.servers, args.history, args.repeat, args.chunk_bytes) < 1:
        print("trimtab bench policies: every count must be at least 1", flush=True)
        return 2
    out = measure(
        args.workers,
        args.servers,
        model_mb=args.model_mb,
        chunk_bytes=args.chunk_bytes,
        history=args.history,
        repeat=args.repeat,
    )
    if args.json:
        print(json.dumps(out), flush=True)
        return 0
    print(f"{out['workers']} workers, {out['servers']} servers, {out['chunks']} chunks:")
    for name, t in out["calls"].items():
        print(f"  {name:>22}: median {t['median_ms']:8.3f} ms, max {t['max_ms']:8.3f} ms")
    print(f"  slowest: {out['slowest']} ({out['slowest_ms']} ms)")
    return 0
