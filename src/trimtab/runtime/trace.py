"""One process's timeline for ``--trace DIR``: its events in memory, its clock's offset
to the coordinator's, and the Chrome-trace file (Trace Event Format, which Perfetto and
chrome://tracing read) it writes at its end.

Each process of a traced job holds one :class:`Trace`, passed to the parts that mark
events (a worker's pusher, a server's store and receipts, the coordinator's event
stream); untraced, they hold None and pay one ``is not None`` test per chunk. An event
is a tuple appended to a list (no lock: ``list.append`` is atomic), at most ``limit``
of them; the rest are counted as dropped and the file says so.

Clocks. Events are stamped with this process's wall clock (``time.time``). To put them
on the coordinator's clock, :class:`ClockSync` keeps NTP's estimate from the heartbeats
every member already sends: the heartbeat carries its send time, the coordinator's echo
carries it back with the coordinator's own time (:mod:`trimtab.runtime.loop`). The
merged file (:mod:`trimtab.observe.timeline`) adds each process's :meth:`ClockSync.correction`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError

log = logging.getLogger("trimtab.trace")

#: ``TRIMTAB_TRACE=DIR``: trace this process into ``DIR`` (the launcher sets it for
#: every role of a job run with ``--trace DIR``).
ENV = "TRIMTAB_TRACE"
#: ``TRIMTAB_TRACE_EVENTS=N``: at most N events kept per process.
LIMIT_ENV = "TRIMTAB_TRACE_EVENTS"
#: Events kept per process by default: about 120 bytes each, so ~60 MB at most.
DEFAULT_LIMIT = 500_000

# One event: name, row (a chunk id, or a kind's row), start (s, own clock), duration
# (s; None for an instant), step (a worker's clock, -1 if none), worker rank (-1).
Event = tuple[str, int, float, "float | None", int, int]


class ClockSync:
    """The offset of this process's clock to the coordinator's, by NTP's arithmetic.

    A probe leaves at ``sent`` (our clock), the coordinator stamps it ``stamped`` (its
    clock), its answer is back at ``back`` (ours): the round trip is ``back - sent``
    and the offset ``stamped - (sent + back) / 2``, exact when both legs take as long
    and off by at most half the round trip otherwise. The sample with the shortest
    round trip is kept (the least queueing, the tightest bound). Thread-safe enough for
    one writer (the thread that reads the coordinator's messages); never blocks.
    """

    def __init__(self) -> None:
        self.offset: float | None = None  # seconds to add to ours to read the coordinator's
        self.rtt: float | None = None  # the round trip of the sample kept
        self.samples = 0

    def add(self, sent: float, stamped: float, back: float) -> None:
        """One round trip's three times (seconds). A negative round trip (our clock
        stepped back meanwhile) is ignored."""
        rtt = back - sent
        if rtt < 0:
            return
        self.samples += 1
        if self.rtt is None or rtt < self.rtt:
            self.rtt = rtt
            self.offset = stamped - (sent + back) / 2

    def correction(self) -> float:
        """Seconds to add to this process's clock to read the coordinator's: the offset,
        or 0 where it is unknown or within its own error (``|offset| <= rtt / 2``: the
        clocks cannot be told apart, as on one host, where every process, and every
        network namespace of the test bed, reads the same kernel clock: there a
        correction would only add the estimate's noise)."""
        if self.offset is None or self.rtt is None or abs(self.offset) <= self.rtt / 2:
            return 0.0
        return self.offset


class Trace:
    """One process's events, written as ``<directory>/<name>.json`` by :meth:`write`.

    ``name`` says the role (``coordinator``, ``server-0``, ``worker-1``); it may be set
    later (a server learns its index once registered). ``clock`` stamps events (the
    wall clock; a test injects its own). Marking never blocks and is thread-safe.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        name: str,
        *,
        limit: int = DEFAULT_LIMIT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.limit = limit
        self.now = clock
        self.sync = ClockSync()
        self.events: list[Event] = []
        self.dropped = 0
        self._written = threading.Lock()
        #: Names of rows that are not chunks (the coordinator's: one per event kind).
        self.rows: dict[int, str] = {}
        #: Arguments of the events that carry more than a step and a rank, by index.
        self.args: dict[int, dict[str, Any]] = {}

    def mark(self, name: str, row: int, step: int = -1, rank: int = -1) -> None:
        """An instant event now on ``row``."""
        events = self.events  # (inline, not through _add: this is per chunk)
        if len(events) < self.limit:
            events.append((name, row, self.now(), None, step, rank))
        else:
            self._full()

    def span(self, name: str, row: int, start: float, step: int = -1, rank: int = -1) -> None:
        """An event from ``start`` (a :meth:`now` reading) until now on ``row``."""
        events = self.events
        if len(events) < self.limit:
            events.append((name, row, start, self.now() - start, step, rank))
        else:
            self._full()

    def instant_at(self, name: str, row: int, at: float, args: dict[str, Any]) -> None:
        """An instant event at ``at`` (own clock) with ``args`` (the coordinator's events)."""
        if len(self.events) < self.limit:
            self.events.append((name, row, at, None, -1, -1))
            self.args[len(self.events) - 1] = args
        else:
            self._full()

    def _full(self) -> None:
        if not self.dropped:
            log.warning(
                "trimtab trace %s: %d events kept, the rest dropped (%s=N keeps more)",
                self.name,
                self.limit,
                LIMIT_ENV,
            )
        self.dropped += 1

    def chrome(self) -> dict[str, Any]:
        """The Trace Event Format object of this process, on its own clock: complete
        (``X``) and instant (``i``) events in microseconds, ``pid`` this process's,
        ``tid`` the row; ``otherData.trimtab`` holds the clock sync and the counts."""
        pid = os.getpid()
        extra = self.args
        out: list[dict[str, Any]] = []
        for i, (name, row, start, dur, step, rank) in enumerate(self.events):
            event: dict[str, Any] = {"name": name, "pid": pid, "tid": row, "ts": start * 1e6}
            if dur is None:
                event["ph"], event["s"] = "i", "t"
            else:
                event["ph"], event["dur"] = "X", dur * 1e6
            args = extra.get(i)
            if args is None:
                args = {}
                if step >= 0:
                    args["step"] = step
                if rank >= 0:
                    args["worker"] = rank
            event["args"] = args
            out.append(event)
        sync = self.sync
        meta = {
            "process": self.name,
            "pid": pid,
            "offset_s": sync.offset,
            "rtt_s": sync.rtt,
            "samples": sync.samples,
            "correction_s": sync.correction(),
            "events": len(self.events),
            "dropped": self.dropped,
            "limit": self.limit,
            "rows": {str(k): v for k, v in self.rows.items()},
        }
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"trimtab": meta}}

    def write(self) -> Path:
        """Write ``<directory>/<name>.json`` (made if missing; through a temporary file,
        so a reader never sees half of it). Blocks on the file; raises ``OSError``."""
        with self._written:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{self.name}.json"
            tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.chrome()))
            tmp.replace(path)
            return path

    def save(self) -> Path | None:
        """:meth:`write`, logging instead of raising where it cannot (a process's last
        act: its trace must not hide why it ended). Returns the path, or None."""
        try:
            path = self.write()
        except OSError as exc:
            log.error("trimtab trace %s: not written: %s", self.name, exc)
            return None
        if self.dropped:
            log.warning("trimtab trace %s: %d events dropped", self.name, self.dropped)
        return path


def trace_from(env: Mapping[str, str], name: str) -> Trace | None:
    """The trace ``env`` asks for (``TRIMTAB_TRACE``, ``TRIMTAB_TRACE_EVENTS``), named
    ``name``, or None. Raises :class:`ConfigError` for a limit that is not a positive
    integer."""
    directory = env.get(ENV, "")
    if not directory:
        return None
    raw = env.get(LIMIT_ENV, "") or str(DEFAULT_LIMIT)
    if not raw.isdigit() or int(raw) <= 0:
        raise ConfigError(f"{LIMIT_ENV} must be a positive number of events, not {raw!r}")
    return Trace(directory, name, limit=int(raw))
