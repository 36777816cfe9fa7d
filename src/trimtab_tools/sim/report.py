"""A simulated run's figures, as JSON values: throughput, step times, the decisions the
policies made, and how long each policy call took on the wall clock."""

from __future__ import annotations

import collections
import itertools
import statistics
from typing import Any

import numpy as np

from trimtab_tools.sim.asynchronous import AsyncSimulation
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.trace import Trace

__all__ = ["summary"]

#: Decisions listed one by one (the rest are counted): the first steps' are what a
#: real run's are compared with.
LISTED_DECISIONS = 20


def step_seconds(trace: Trace, warmup: int) -> list[float]:
    """The job's step times after ``warmup`` steps: the time between successive steps'
    last workers' ends (the first step from 0)."""
    ends = [0.0, *trace.ends]
    return [b - a for a, b in itertools.pairwise(ends)][warmup:]


def worker0_seconds(trace: Trace, warmup: int) -> list[float]:
    """Worker 0's step times after ``warmup`` steps (what the experiments time)."""
    ends = [0.0, *trace.worker0_ends]
    return [b - a for a, b in itertools.pairwise(ends)][warmup:]


def _stragglers(sim: Simulation | AsyncSimulation) -> dict[str, list[int]]:
    """The nodes the policies treated as stragglers by the end: servers left carrying
    under half the median bytes (PSLD unloaded them), workers given under half the
    median batch (LB-BSP) or named by the straggler detector (SaPS)."""
    servers = len(sim.active)
    load = np.bincount(sim.owners, sim.sizes, servers)
    busy = [s for s in range(servers) if sim.active[s]]
    median_load = statistics.median(load[busy].tolist()) if busy else 0.0
    slow_servers = (
        [s for s in busy if load[s] < median_load / 2] if sim.policies.psld is not None else []
    )
    median_batch = float(np.median(sim.batches))
    slow_workers = [sim.ranks[i] for i in np.flatnonzero(sim.batches < median_batch / 2)]
    slow_workers = sorted(set(slow_workers) | sim.flagged_workers)
    return {"servers": slow_servers, "workers": slow_workers}


def summary(sim: Simulation | AsyncSimulation, wall_s: float) -> dict[str, Any]:
    """The figures of a finished :class:`Simulation` (``wall_s``: what it took). Pure."""
    job, tr = sim.job, sim.trace
    steps = step_seconds(tr, job.warmup)
    span = tr.ends[-1] - (tr.ends[job.warmup - 1] if job.warmup else 0.0)
    ordered = sorted(steps)
    kinds = collections.Counter(d.kind for d in tr.decisions)
    sizes = sim.batches.astype(int).tolist()
    return {
        "placement": job.settings.placement.policy,
        "batching": job.settings.batching.policy,
        "mode": job.settings.consistency.mode,
        "stragglers": [str(s) for s in job.stragglers],
        "throughput_samples_per_s": round(job.global_batch * len(steps) / span, 3),
        "steps_per_s": round(len(steps) / span, 4),
        "median_step_s": round(statistics.median(steps), 6),
        "p99_step_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 6),
        "worker0_median_step_s": round(statistics.median(worker0_seconds(tr, job.warmup)), 6),
        "simulated_s": round(tr.ends[-1], 4),
        "migrations": tr.migrations,
        "bytes_moved": tr.bytes_moved,
        "servers_at_end": sum(sim.active),
        "decision_counts": dict(kinds),
        "decisions": [
            {"kind": d.kind, "clock": d.clock, "at_s": d.at, **d.detail}
            for d in tr.decisions[:LISTED_DECISIONS]
        ],
        "stragglers_detected": _stragglers(sim),
        "consistency": dict(sim.counters),
        "batch_sizes": {
            "min": min(sizes),
            "median": int(statistics.median(sizes)),
            "max": max(sizes),
            **({"last": sizes} if len(sizes) <= 16 else {}),
        },
        # The records of a real run (``trimtab experiment psld``'s): worker 0's step
        # times and the map's epoch at each step.
        "step_times": [round(t, 6) for t in worker0_seconds(tr, job.warmup)],
        "epochs": tr.epochs[job.warmup :],
        "slowest_decision_ms": round(sim.policies.times.slowest_ms, 3),
        "slowest_decision": sim.policies.times.slowest_name,
        "decision_times": sim.policies.times.to_dict(),
        "wall_s": round(wall_s, 3),
    }
