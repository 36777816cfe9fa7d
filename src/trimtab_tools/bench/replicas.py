"""``trimtab bench datapath --replicas 1``: what keeping every chunk's backup in step
costs the step.

In one run, interleaved round by round so that a machine's drift touches both alike,
the 100 MiB push+pull step of ``trimtab bench datapath`` (2 workers x 2 servers, its
default path) without replicas and with ``--replicas 1`` (each round's applied chunk
sent to its backup, the values released once it acknowledged). Each figure is the
median over rounds of each job's median step; ``replicas_over_none`` their ratio.
"""

from __future__ import annotations

import statistics
from typing import Any

from trimtab_tools.bench.job import interleaved, job_shape


def measure_replicas(
    sizes: list[int], steps: int, chunk_bytes: int, replicas: int = 1, rounds: int = 3
) -> dict[str, Any]:
    """Run the job without and with ``replicas``, ``rounds`` times interleaved. Blocks
    (about ``rounds`` x 30 s here); raises RuntimeError if a job fails."""
    runs = interleaved({0: {}, replicas: {"replicas": replicas}}, sizes, steps, chunk_bytes, rounds)
    none, with_replicas = statistics.median(runs[0]), statistics.median(runs[replicas])
    return {
        "benchmark": "datapath-replicas",
        **job_shape(sizes, steps, chunk_bytes, rounds),
        "replicas": replicas,
        "step_s": round(none, 5),
        "step_replicas_s": round(with_replicas, 5),
        "replicas_over_none": round(with_replicas / none, 3),
        "rounds_s": {str(k): [round(v, 5) for v in vs] for k, vs in runs.items()},
    }
