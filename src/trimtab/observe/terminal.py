"""The launcher's status line: the job's step, throughput, servers and stragglers, kept
from the coordinator's event stream, and the loss and accuracy the script reports
(its marker lines, :mod:`.figures`) (read from the dashboard's ``/api/events``, the
same stream the page reads). On a terminal it is a rich live line under the job's
output; elsewhere (a CI log) a plain line every :data:`LOG_EVERY_S` seconds.

Use it as ``trimtab run``'s output handler: it passes every line through, and starts
following the stream once the coordinator prints the dashboard's address.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live

from trimtab.observe.figures import figures_text, reported
from trimtab.observe.state import JobState

#: Without a terminal, a status line this often.
LOG_EVERY_S = 10.0

_DASHBOARD = re.compile(r"dashboard at (http://[\d.]+:\d+/)")


def status_text(state: JobState, figures: dict[str, float] | None = None) -> str:
    """One line: step, samples/s, the loss and accuracy the script reported last
    (``figures``: :mod:`.figures`), live servers and workers, map epoch, migrations,
    stragglers. Never blocks."""
    snap = state.snapshot()
    slow = ", ".join(sorted(state.stragglers)) or "none"
    return (
        f"step {snap['clock']} | {snap['throughput']:.0f} samples/s{figures_text(figures or {})}"
        f" | servers {len(snap['live_servers'])} | workers {len(snap['live_workers'])} | "
        f"epoch {snap['epoch']} | migrations {snap['migrations']} | stragglers {slow}"
    )


class StatusLine:
    """An output handler ``(source, line)`` that prints the job's lines and keeps a
    status line (see the module docstring). :meth:`close` stops it. Thread-safe."""

    def __init__(self, terminal: bool | None = None) -> None:
        self.state = JobState()
        #: The latest loss and accuracy the workers' script reported (its marker lines).
        self.figures: dict[str, float] = {}
        self._console = Console(highlight=False, soft_wrap=True)
        self.terminal = self._console.is_terminal if terminal is None else terminal
        self._live: Live | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __call__(self, source: str, line: str) -> None:
        figures = reported(line) if source.startswith("worker") else None
        with self._lock:
            if figures:
                self.figures.update(figures)
            if self._live is not None:
                self._live.console.print(f"[{source}] {line}", markup=False)
            else:
                sys.stdout.write(f"[{source}] {line}\n")
                sys.stdout.flush()
        found = _DASHBOARD.search(line)
        if source == "coordinator" and found and self._thread is None:
            self._thread = threading.Thread(
                target=self._follow, args=(found.group(1),), name="trimtab-status", daemon=True
            )
            self._thread.start()

    def _follow(self, url: str) -> None:
        seq, said = 0, time.monotonic()
        if self.terminal:
            with self._lock:
                self._live = Live("", console=self._console, refresh_per_second=4)
                self._live.start()
        while not self._stop.wait(1.0):
            try:
                with urllib.request.urlopen(f"{url}api/events?since={seq}", timeout=5) as r:
                    body: dict[str, Any] = json.loads(r.read())
            except (OSError, ValueError):
                continue  # not up, or gone: the job's end stops this
            for event in body["events"]:
                self.state(event)
                seq = event["seq"]
            with self._lock:
                figures = dict(self.figures)
            text = status_text(self.state, figures)
            if self._live is not None:
                self._live.update(text)
            elif time.monotonic() - said >= LOG_EVERY_S:
                said = time.monotonic()
                self(source="trimtab", line=text)

    def close(self) -> None:
        """Stop following; the line's last state stays on screen. Blocks up to 2 s."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None


def run_with_status(run: Callable[[Callable[[str, str], None]], int]) -> int:
    """``run(output)`` with a :class:`StatusLine` as its output handler; returns its
    status. Blocks as ``run`` does."""
    line = StatusLine()
    try:
        return run(line)
    finally:
        line.close()
