"""The job as the event stream tells it so far: each worker's latest step, each server's
latest load, the placement, the counts of what happened. One listener of the stream
(:class:`~trimtab.roles.coordinator.events.Events`) keeps it; the run record's
periodic metrics and summary and the terminal line read it. Pure: no I/O.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from trimtab.roles.coordinator.events import Event

#: Seconds of step reports the throughput is taken over.
RATE_WINDOW_S = 10.0

_COUNTED = ("refused", "saps", "failover", "checkpoint", "straggler")


class JobState:
    """A listener of the event stream (call it with each event) that keeps the job's
    latest figures. Thread-safe: the stream's thread feeds it, any thread reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.job: dict[str, Any] = {}
        self.started = 0.0
        self.last_t = 0.0
        self.workers: dict[int, Event] = {}
        self.servers: dict[int, Event] = {}
        self.members: dict[str, str] = {}  # "server 0" -> its state
        self.placement: Event | None = None
        self.steps = 0
        self.samples = 0
        self.migrations = 0
        self.bytes_moved = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.stragglers: dict[str, str] = {}  # "server 1" -> why, the latest ones
        self.ended: Event | None = None
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def __call__(self, event: Event) -> None:
        kind, t = event["kind"], float(event["t"])
        with self._lock:
            self.started = self.started or t
            self.last_t = t
            if kind == "job":
                self.job = {k: v for k, v in event.items() if k not in ("seq", "t", "kind")}
            elif kind == "step":
                self.workers[event["rank"]] = event
                self.steps += 1
                self.samples += int(event["batch"])
                self._recent.append((t, int(event["batch"])))
                while self._recent and self._recent[0][0] < t - RATE_WINDOW_S:
                    self._recent.popleft()
            elif kind == "load":
                self.servers[event["server"]] = event
            elif kind == "placement":
                self.placement = event
            elif kind == "migration" and event["phase"] == "done":
                self.migrations = int(event["migrations"])
                self.bytes_moved = int(event["bytes_moved"])
            elif kind == "member":
                self.members[f"{event['role']} {event['rank']}"] = event["state"]
            elif kind == "end":
                self.ended = event
            if kind in _COUNTED:
                self.counts[kind] += 1
            if kind == "straggler":
                self.stragglers[f"{event['role']} {event['rank']}"] = event["why"]

    @property
    def clock(self) -> int:
        """The slowest worker's clock: steps every worker finished."""
        with self._lock:
            return min((int(e["clock"]) + 1 for e in self.workers.values()), default=0)

    def throughput(self) -> float:
        """Samples per second over the last :data:`RATE_WINDOW_S` of step reports."""
        with self._lock:
            if len(self._recent) < 2:
                return 0.0
            span = self._recent[-1][0] - self._recent[0][0]
            return sum(b for _, b in self._recent) / span if span > 0 else 0.0

    def live(self, role: str) -> list[int]:
        """The ranks of ``role`` ("server", "worker") that are neither lost, retired nor
        done."""
        with self._lock:
            return sorted(
                int(who.split()[1])
                for who, state in self.members.items()
                if who.startswith(role) and state not in ("lost", "retired", "done")
            )

    def snapshot(self) -> dict[str, Any]:
        """The figures now, as JSON values: a line of the run record's metrics."""
        clock, rate = self.clock, self.throughput()
        servers, workers = self.live("server"), self.live("worker")
        with self._lock:
            placement = self.placement or {}
            return {
                "t": self.last_t,
                "clock": clock,
                "steps": self.steps,
                "samples": self.samples,
                "throughput": rate,
                "epoch": placement.get("epoch", 0),
                "chunks": placement.get("chunks", []),
                "bytes": placement.get("bytes", []),
                "live_servers": servers,
                "live_workers": workers,
                "migrations": self.migrations,
                "bytes_moved": self.bytes_moved,
                "counts": dict(self.counts),
                "workers": {
                    str(r): {k: e[k] for k in ("clock", "batch", "compute_s", "comm_s", "lag")}
                    for r, e in sorted(self.workers.items())
                },
                "servers": {
                    str(r): {k: e[k] for k in ("busy_s", "bytes", "requests", "speed")}
                    for r, e in sorted(self.servers.items())
                },
            }

    def summary(self) -> dict[str, Any]:
        """What the run came to: :meth:`snapshot` plus its duration, the job and how it
        ended."""
        snap = self.snapshot()
        with self._lock:
            duration = self.last_t - self.started if self.started else 0.0
            return {
                "job": self.job,
                "duration_s": duration,
                "mean_throughput": self.samples / duration if duration > 0 else 0.0,
                "ended": None if self.ended is None else {"why": self.ended.get("why")},
                "stragglers": dict(self.stragglers),
                **snap,
            }
