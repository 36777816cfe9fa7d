"""``trimtab bench datapath --observe compare``: what the live view costs the step.

In one run, interleaved round by round so that a machine's drift touches both alike,
the 100 MiB push+pull step of ``trimtab bench datapath`` (2 workers x 2 servers, its
default path) with the live view off (``--no-dashboard --runs-dir ''``) and on (the
dashboard and ``/metrics`` served, the run record written, and a viewer attached for
the whole job: a reader of the dashboard's event stream, as an open page, and a
Prometheus scrape of ``/metrics`` every second). Each figure is the median over rounds
of each job's median step; ``on_over_off`` their ratio (the goal: within 1.03).
"""

from __future__ import annotations

import re
import statistics
import tempfile
import threading
import time
import urllib.request
from typing import Any

from trimtab.observe.settings import ObserveSettings
from trimtab_tools.bench.job import interleaved, job_shape

_DASHBOARD = re.compile(r"dashboard at (http://[\d.]+:\d+/)")


class Viewer:
    """A job's output handler that, once the coordinator prints the dashboard's address,
    attaches a viewer to it: one thread reads ``/api/stream`` (as an open page does),
    another scrapes ``/metrics`` every second, both until the job's dashboard goes.
    Counts what they got (``events_bytes``, ``scrapes``)."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.events_bytes = 0

    def __call__(self, source: str, line: str) -> None:
        found = _DASHBOARD.search(line)
        if source == "coordinator" and found:
            url = found.group(1)
            threading.Thread(target=self._stream, args=(url,), daemon=True).start()
            threading.Thread(target=self._scrape, args=(url,), daemon=True).start()

    def _stream(self, url: str) -> None:
        try:
            with urllib.request.urlopen(url + "api/stream", timeout=30) as stream:
                while chunk := stream.read1(65536):
                    self.events_bytes += len(chunk)
        except OSError:
            pass  # the job ended

    def _scrape(self, url: str) -> None:
        while True:
            try:
                with urllib.request.urlopen(url + "metrics", timeout=5) as reply:
                    reply.read()
                self.scrapes += 1
            except OSError:
                return  # the job ended
            time.sleep(1.0)


def measure_observe(
    sizes: list[int], steps: int, chunk_bytes: int, rounds: int = 3
) -> dict[str, Any]:
    """Run the job with the live view off and on (viewed), ``rounds`` times
    interleaved. Blocks (about ``rounds`` x 2 x 30 s here); raises RuntimeError if a
    job fails."""
    viewer = Viewer()
    with tempfile.TemporaryDirectory(prefix="trimtab-bench-runs-") as runs:
        on = ObserveSettings(runs_dir=runs)
        variants: dict[Any, dict[str, Any]] = {
            "off": {},
            "on": {"observe": on, "on_line": viewer},
        }
        result = interleaved(variants, sizes, steps, chunk_bytes, rounds)
    off, viewed = statistics.median(result["off"]), statistics.median(result["on"])
    return {
        "benchmark": "datapath-observe",
        **job_shape(sizes, steps, chunk_bytes, rounds),
        "step_off_s": round(off, 5),
        "step_on_s": round(viewed, 5),
        "on_over_off": round(viewed / off, 3),
        "scrapes": viewer.scrapes,
        "streamed_bytes": viewer.events_bytes,
        "rounds_s": {k: [round(v, 5) for v in vs] for k, vs in result.items()},
    }
