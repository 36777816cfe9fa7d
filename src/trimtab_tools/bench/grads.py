"""``trimtab bench datapath --grads compare``: what reading ``.grad`` after ``step()``
costs a script that does it (Horovod's mean gradient, which a server-mode job fetches
from the servers when the script reads it: ``trimtab.frontend.meangrad``).

In one run, interleaved round by round so that a machine's drift touches both alike,
the 100 MiB push+pull step of ``trimtab bench datapath`` (2 workers x 2 servers, its
default path), its script reading every parameter's ``.grad`` after each ``step()``
(within the timed step) or not. Each figure is the median over rounds of each job's
median step; ``read_over_none`` their ratio. What the mean costs a script that never
reads ``.grad`` is the job without reads against the tree before (``tools/bench-ab``).
"""

from __future__ import annotations

import statistics
from typing import Any

from trimtab_tools.bench.job import interleaved, job_shape


def measure_grads(
    sizes: list[int], steps: int, chunk_bytes: int, rounds: int = 3
) -> dict[str, Any]:
    """Run the job without and with reads of ``.grad``, ``rounds`` times interleaved.
    Blocks (about ``rounds`` x 30 s here); raises RuntimeError if a job fails."""
    variants = {"none": {}, "read": {"read_grads": True}}
    runs = interleaved(variants, sizes, steps, chunk_bytes, rounds)
    none, with_reads = statistics.median(runs["none"]), statistics.median(runs["read"])
    return {
        "benchmark": "datapath-grads",
        **job_shape(sizes, steps, chunk_bytes, rounds),
        "step_s": round(none, 5),
        "step_read_grads_s": round(with_reads, 5),
        "read_over_none": round(with_reads / none, 3),
        "rounds_s": {k: [round(v, 5) for v in vs] for k, vs in runs.items()},
    }
