"""The coordinator's event stream: what happened in the job, as small JSON-able records
in a bounded ring, numbered in order. The live view (:mod:`trimtab.observe`: the
dashboard, ``/metrics``, run records, traces) reads this one stream; nothing else in
the job reports to it. :mod:`.watch` is what fills it.

An event is a dict with ``seq`` (1, 2, ... in order), ``t`` (seconds since the epoch,
the coordinator's clock), ``kind`` (see :data:`KINDS`) and the kind's fields.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("trimtab.coordinator")

#: Events kept for readers that come late (a dashboard opened mid-job): about a minute
#: of a fast 8-worker job's step reports; listeners see every event regardless.
CAPACITY = 20_000

#: Each kind of event and its fields (besides ``seq``, ``t`` and ``kind``).
KINDS: dict[str, str] = {
    "job": "job, workers, servers, placement, consistency, batching, chunk_bytes",
    "step": "rank, clock, batch, compute_s, comm_s, cpu, lag (steps behind the leader)",
    "load": "server, busy_s, bytes, bytes_in, bytes_out, requests (cumulative), speed (bytes/s)",
    "placement": "epoch, chunks and bytes (per server), owners (per chunk)",
    "migration": "phase (start, done, abandoned), epoch, chunks, bytes, migrations, bytes_moved",
    "straggler": "role, rank, why",
    "batch_sizes": "sizes (per worker rank)",
    "saps": "rank, lead (told to skip ahead to the leader's clock)",
    "member": "role, rank, state (a MemberState value), addr (a server's, where it serves)",
    "traffic": "clock, servers ([server, span_s, wait_s, bytes] once every worker's are in)",
    "servers_wanted": "target (active servers the job asks the launcher for)",
    "failover": "failovers (completed so far), epoch",
    "checkpoint": "path (the newest complete checkpoint)",
    "refused": "code, msg (a request answered with an ERROR)",
    "end": "why (None for a normal end)",
}

Event = dict[str, Any]
Listener = Callable[[Event], None]


class Events:
    """A bounded ring of the job's events plus listeners called on each one.

    :meth:`emit` is called from the coordinator's loop; :meth:`since` and :meth:`latest`
    from any thread (the dashboard's): all three are thread-safe and never block for
    long. A listener runs in the emitting thread, so it must be quick; one that raises
    is logged once and dropped, and the job goes on.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._ring: collections.deque[Event] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._seq = 0
        self._listeners: list[Listener] = []
        self._changed = threading.Condition(self._lock)

    @property
    def seq(self) -> int:
        """The number of the newest event (0 before any)."""
        return self._seq

    def listen(self, listener: Listener, *, replay: bool = False) -> None:
        """Call ``listener`` with every event emitted from now on (in order, in the
        emitting thread); ``replay``: first with those still in the ring, in this
        thread, none missed or repeated in between."""
        with self._lock:
            if replay:
                for event in self._ring:
                    listener(event)
            self._listeners.append(listener)

    def emit(self, kind: str, **fields: Any) -> Event:
        """Record an event of ``kind`` (one of :data:`KINDS`) and tell the listeners.
        Returns it. Raises ``ValueError`` for an unknown kind (a bug)."""
        if kind not in KINDS:
            raise ValueError(f"no event kind {kind!r}; the kinds are {sorted(KINDS)}")
        with self._lock:
            self._seq += 1
            event: Event = {"seq": self._seq, "t": time.time(), "kind": kind, **fields}
            self._ring.append(event)
            listeners = list(self._listeners)
            self._changed.notify_all()
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("an event listener failed; it is dropped")
                with self._lock:
                    if listener in self._listeners:
                        self._listeners.remove(listener)
        return event

    def since(self, seq: int, limit: int = 5000) -> list[Event]:
        """The events after number ``seq`` still in the ring (at most ``limit``, the
        oldest first). Never blocks for long."""
        with self._lock:
            first = self._seq - len(self._ring) + 1
            skip = max(0, seq + 1 - first)
            return list(itertools.islice(self._ring, skip, skip + limit))

    def wait(self, seq: int, timeout_s: float) -> bool:
        """Block until an event after ``seq`` exists or ``timeout_s`` passes; returns
        whether one does."""
        with self._changed:
            return self._changed.wait_for(lambda: self._seq > seq, timeout_s)
