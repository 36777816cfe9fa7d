"""P3's send side: a bound on the push bytes a worker has in flight to each server.

Backward produces the last layers' gradients first, and the next forward needs the
first layers' values first. Where a server's link is the bottleneck, pushes sent as
they are produced queue in the link in that wrong order, and a server's priority
(:mod:`trimtab.roles.server.priority`) cannot reorder what has not arrived yet. So the
worker keeps at most :attr:`CreditGate.window` bytes of pushes in flight to each
server and holds the others back; when credit returns, the held push of the highest
priority (the lowest chunk id: the first layers, in ``named_parameters`` order) goes
first.

Credit returns on receipt: the server sends a CREDIT as it reads a push off its socket
(:mod:`trimtab.roles.server.receipt`), not with the push's reply. Under BSP a reply
waits for every worker's push of that chunk; credit that waited for replies would let
one worker's held-back pushes stall another's replies (each holding what the other's
round needs). A reply that comes before its CREDIT (a server answering an error) also
returns the credit, so nothing is held for a CREDIT that never comes.

A push is sent at once whenever nothing is held for its server and its bytes fit in the
window; a push bigger than the whole window is sent alone (nothing else in flight),
so every push is eventually sent.

:class:`CreditGate` is pure bookkeeping: it sends nothing and never blocks; the worker's
client (:mod:`trimtab.roles.worker.client`) sends what it admits and releases.
Thread-safe (one lock).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
from collections.abc import Mapping
from typing import Generic, TypeVar

from trimtab.errors import ConfigError

__all__ = ["DEFAULT_WINDOW", "ENV", "CreditGate", "CreditStats", "window_from_env"]

#: The push bytes in flight per server, in bytes; ``0``: no bound.
ENV = "TRIMTAB_CREDIT_BYTES"
#: The default bound: a few chunks of the default size in flight to each server, enough
#: to keep a link busy while each CREDIT comes back, few enough that a first layer's push
#: waits behind at most this much (BENCHMARKS.md, "P3's send side").
DEFAULT_WINDOW = 4 << 20


def window_from_env(environ: Mapping[str, str]) -> int:
    """``TRIMTAB_CREDIT_BYTES`` (:data:`DEFAULT_WINDOW` if unset; ``0``: no bound), for
    the edge that builds a worker's settings. Raises :class:`ConfigError` for a value
    that is not a whole number >= 0. Never blocks."""
    raw = environ.get(ENV, "")
    if not raw:
        return DEFAULT_WINDOW
    try:
        window = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV}={raw!r} must be a whole number of bytes (0: no bound)") from None
    if window < 0:
        raise ConfigError(f"{ENV}={raw!r} must be >= 0 (0: no bound)")
    return window


#: What the gate holds for the caller: the message to send once admitted.
M = TypeVar("M")


@dataclasses.dataclass
class CreditStats:
    """What a gate did, for tests and benchmarks.

    Attributes:
        admitted: pushes sent at once.
        held: pushes held back for credit (sent later, when released).
        peak_bytes: the most push bytes that were ever in flight to one server at once.
    """

    admitted: int = 0
    held: int = 0
    peak_bytes: int = 0


@dataclasses.dataclass
class _Server(Generic[M]):
    in_flight: int = 0
    #: request id -> bytes, of the pushes sent and not yet credited.
    sent: dict[int, int] = dataclasses.field(default_factory=dict)
    #: (priority, arrival, request id, bytes, message) of the pushes held back.
    held: list[tuple[int, int, int, int, M]] = dataclasses.field(default_factory=list)


class CreditGate(Generic[M]):
    """Per-server credit of push bytes (see the module's docstring).

    Args:
        window: the push bytes that may be in flight to one server (> 0).
        ordered: release held pushes by priority (P3); ``False``: in the order they
            were pushed (arrival order, to compare).
    """

    def __init__(self, window: int, *, ordered: bool = True) -> None:
        if window <= 0:
            raise ConfigError(f"the credit window must be > 0 bytes, not {window}")
        self.window = window
        self.ordered = ordered
        self.stats = CreditStats()
        #: Pushes sent and not yet credited, all servers together: 0 lets a reply skip
        #: the gate (read without the lock: a push is counted before it is sent).
        self.outstanding = 0
        self._servers: dict[str, _Server[M]] = {}
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    def admit(self, server: str, rid: int, nbytes: int, priority: int, message: M) -> bool:
        """A push of ``nbytes`` (request ``rid``, ``priority``: lower goes first) to
        ``server``: ``True`` if it may be sent now (its bytes are then in flight),
        ``False`` if the gate holds ``message`` until :meth:`credit` releases it.
        Never blocks."""
        with self._lock:
            s = self._servers.get(server)
            if s is None:
                s = self._servers[server] = _Server()
            if not s.held and self._fits(s, nbytes):
                self._take(s, rid, nbytes)
                self.stats.admitted += 1
                return True
            order = priority if self.ordered else 0
            heapq.heappush(s.held, (order, next(self._arrivals), rid, nbytes, message))
            self.stats.held += 1
            return False

    def credit(self, server: str, rid: int) -> list[M]:
        """The push of request ``rid`` to ``server`` was received (its CREDIT, or its
        reply): return its bytes to the window, and return the held messages that now
        fit, in the order to send them (their bytes now in flight). A request the gate
        does not know, or already credited, changes nothing. Never blocks."""
        with self._lock:
            s = self._servers.get(server)
            if s is None:
                return []
            nbytes = s.sent.pop(rid, None)
            if nbytes is None:
                return []
            s.in_flight -= nbytes
            self.outstanding -= 1
            released: list[M] = []
            while s.held and self._fits(s, s.held[0][3]):
                _, _, held_rid, held_bytes, message = heapq.heappop(s.held)
                self._take(s, held_rid, held_bytes)
                released.append(message)
            return released

    def forget(self, server: str) -> None:
        """``server`` died: drop its held pushes (their requests fail and go to the new
        owners, through the gate again) and the bytes it never credited. Never blocks
        (beyond the lock)."""
        with self._lock:
            s = self._servers.pop(server, None)
            if s is not None:
                self.outstanding -= len(s.sent)

    def holding(self) -> bool:
        """Whether any push is held back for credit. Never blocks (beyond the lock)."""
        with self._lock:
            return any(s.held for s in self._servers.values())

    def in_flight(self, server: str) -> int:
        """The push bytes sent to ``server`` and not yet credited. Never blocks."""
        with self._lock:
            s = self._servers.get(server)
            return 0 if s is None else s.in_flight

    def describe(self) -> str:
        """Bytes in flight and pushes held, per server, for a hung job's dump."""
        with self._lock:
            parts = [
                f"{name}: {s.in_flight} bytes in flight, {len(s.held)} held"
                for name, s in self._servers.items()
                if s.in_flight or s.held
            ]
        return "credit: " + ("; ".join(parts) if parts else "nothing in flight")

    def _fits(self, s: _Server[M], nbytes: int) -> bool:
        return s.in_flight == 0 or s.in_flight + nbytes <= self.window

    def _take(self, s: _Server[M], rid: int, nbytes: int) -> None:
        s.sent[rid] = nbytes
        s.in_flight += nbytes
        self.outstanding += 1
        self.stats.peak_bytes = max(self.stats.peak_bytes, s.in_flight)
