"""``trimtab bench datapath --trace compare``: what ``--trace`` costs the step.

In one run, interleaved round by round so that a machine's drift touches both alike,
the 100 MiB push+pull step of ``trimtab bench datapath`` (2 workers x 2 servers, its
default path; the live view off in both) untraced and traced (``--trace DIR``: every
process marks its events, the launcher merges the files at the end). Each figure is
the median over rounds of each job's median step; ``on_over_off`` their ratio. The
events a traced job kept are counted from its merged file.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from trimtab.observe.settings import ObserveSettings
from trimtab.observe.timeline import MERGED
from trimtab_tools.bench.job import interleaved, job_shape


def measure_trace(
    sizes: list[int], steps: int, chunk_bytes: int, rounds: int = 3
) -> dict[str, Any]:
    """Run the job untraced and traced, ``rounds`` times interleaved. Blocks (about
    ``rounds`` x 2 x 30 s here); raises RuntimeError if a job fails."""
    with tempfile.TemporaryDirectory(prefix="trimtab-bench-trace-") as tmp:
        traced = ObserveSettings(no_dashboard=True, runs_dir="", trace=tmp)
        variants: dict[Any, dict[str, Any]] = {"off": {}, "on": {"observe": traced}}
        result = interleaved(variants, sizes, steps, chunk_bytes, rounds)
        merged = json.loads((Path(tmp) / MERGED).read_text())
    processes = merged["otherData"]["trimtab"]["processes"]
    off, on = statistics.median(result["off"]), statistics.median(result["on"])
    return {
        "benchmark": "datapath-trace",
        **job_shape(sizes, steps, chunk_bytes, rounds),
        "step_off_s": round(off, 5),
        "step_on_s": round(on, 5),
        "on_over_off": round(on / off, 3),
        "events_per_job": {p["process"]: p["events"] for p in processes},
        "trace_bytes": len(json.dumps(merged)),
        "rounds_s": {k: [round(v, 5) for v in vs] for k, vs in result.items()},
    }
