"""P3's credit, both ways: a bound on the bytes one sender has in flight to each peer,
the rest held back and released first layers first.

Backward produces the last layers' gradients first, and the next forward needs the
first layers' values first. Where a link is the bottleneck, messages sent as they are
produced queue in the link in that wrong order, and nothing downstream can reorder what
has not arrived yet. So a sender keeps at most a window of bytes in flight to each peer
and holds the others back; when credit returns, the held message of the highest
priority (the lowest chunk id: the first layers, in ``named_parameters`` order) goes
first. Two senders use it:

* **a worker's pushes** (:mod:`trimtab.roles.worker.client`): credit returns on
  receipt, the server sending a CREDIT as it reads a push off its socket
  (:mod:`trimtab.roles.server.receipt`), not with the push's reply. Under BSP a reply
  waits for every worker's push of that chunk; credit that waited for replies would let
  one worker's held-back pushes stall another's replies (each holding what the other's
  round needs). A reply that comes before its CREDIT (a server answering an error) also
  returns the credit, so nothing is held for a CREDIT that never comes.
* **a server's values** (:mod:`trimtab.roles.server.receipt`): a worker that bounds its
  pushes says so in each push (``vk``, its window), and credits each value it reads with
  a CREDIT of its own. Without it, a server hands every completed round's values to its
  socket at once, and the first layer's value, whose round completes last, queues
  behind all the others on the server's link.

A message is sent at once whenever nothing is held for its peer and its bytes fit in the
window; one bigger than the whole window is sent alone (nothing else in flight), so
every message is eventually sent.

:class:`CreditGate` is pure bookkeeping: it sends nothing and never blocks; its users
send what it admits and releases. Thread-safe (one lock).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

from trimtab.errors import ConfigError

__all__ = ["ENV", "ONE_CHUNK", "CreditGate", "CreditStats", "window_from_env"]

#: The bytes in flight per peer, both ways (a worker's pushes to each server, and the
#: values each server sends it), in bytes; ``0``: no bound.
ENV = "TRIMTAB_CREDIT_BYTES"
#: The default bound, a window of the job's chunk size (``--chunk-bytes``): one chunk in
#: flight to each server, and from it. Enough to keep a link busy while each CREDIT comes
#: back (it returns on receipt, a round trip after the chunk's last byte), and a first
#: layer's push or value waits behind at most a chunk per link. On the test bed it was
#: also the fastest unshaped: 4 MiB windows of 1 MiB chunks let the kernel's buffers
#: fill, and the 100 MiB step took 0.16 to 0.17 s against 0.13 to 0.14 (BENCHMARKS.md).
ONE_CHUNK = -1


def window_from_env(environ: Mapping[str, str]) -> int:
    """``TRIMTAB_CREDIT_BYTES`` (:data:`ONE_CHUNK` if unset; ``0``: no bound), for the
    edge that builds a worker's settings. Raises :class:`ConfigError` for a value that
    is not a whole number >= 0. Never blocks."""
    raw = environ.get(ENV, "")
    if not raw:
        return ONE_CHUNK
    try:
        window = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV}={raw!r} must be a whole number of bytes (0: no bound)") from None
    if window < 0:
        raise ConfigError(f"{ENV}={raw!r} must be >= 0 (0: no bound)")
    return window


#: What the gate holds for the caller: the message to send once admitted.
M = TypeVar("M")
#: What the gate tells peers apart by: a server's address, a worker's socket identity.
K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass
class CreditStats:
    """What a gate did, for tests and benchmarks.

    Attributes:
        admitted: messages sent at once.
        held: messages held back for credit (sent later, when released).
        peak_bytes: the most bytes that were ever in flight to one peer at once.
    """

    admitted: int = 0
    held: int = 0
    peak_bytes: int = 0


@dataclasses.dataclass
class _Peer(Generic[M]):
    window: int
    in_flight: int = 0
    #: request id -> bytes, of the messages sent and not yet credited.
    sent: dict[int, int] = dataclasses.field(default_factory=dict)
    #: (priority, arrival, request id, bytes, message) of the messages held back.
    held: list[tuple[int, int, int, int, M]] = dataclasses.field(default_factory=list)


class CreditGate(Generic[K, M]):
    """Per-peer credit of push bytes (see the module's docstring).

    Args:
        window: the push bytes that may be in flight to one peer (> 0).
        ordered: release held messages by priority (P3); ``False``: in the order they
            were admitted (arrival order, to compare).
    """

    def __init__(self, window: int, *, ordered: bool = True) -> None:
        if window <= 0:
            raise ConfigError(f"the credit window must be > 0 bytes, not {window}")
        self.window = window
        self.ordered = ordered
        self.stats = CreditStats()
        #: Messages sent and not yet credited, all peers together: 0 lets a reply skip
        #: the gate (read without the lock: a message is counted before it is sent).
        self.outstanding = 0
        self._peers: dict[K, _Peer[M]] = {}
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    def admit(
        self, peer: K, rid: int, nbytes: int, priority: int, message: M, window: int = 0
    ) -> bool:
        """A message of ``nbytes`` (request ``rid``, ``priority``: lower goes first) to
        ``peer``: ``True`` if it may be sent now (its bytes are then in flight),
        ``False`` if the gate holds ``message`` until :meth:`credit` releases it.
        ``window`` > 0: this peer's own bound (the gate's otherwise; its latest is
        kept). Never blocks."""
        with self._lock:
            s = self._peers.get(peer)
            if s is None:
                s = self._peers[peer] = _Peer(window or self.window)
            elif window:
                s.window = window
            if not s.held and (s.in_flight == 0 or s.in_flight + nbytes <= s.window):  # (fits)
                self._take(s, rid, nbytes)
                self.stats.admitted += 1
                return True
            order = priority if self.ordered else 0
            heapq.heappush(s.held, (order, next(self._arrivals), rid, nbytes, message))
            self.stats.held += 1
            return False

    def credit(self, peer: K, rid: int) -> list[M]:
        """The message of request ``rid`` to ``peer`` was received (its CREDIT, or,
        for a push, its reply): return its bytes to the window, and return the held
        messages that now fit, in the order to send them (their bytes now in flight). A
        request the gate does not know, or already credited, changes nothing. Never
        blocks."""
        with self._lock:
            s = self._peers.get(peer)
            if s is None:
                return []
            nbytes = s.sent.pop(rid, None)
            if nbytes is None:
                return []
            s.in_flight -= nbytes
            self.outstanding -= 1
            if not s.held:
                return []
            released: list[M] = []
            # (admit's fit and _take, inlined: a credit a chunk releases the next push)
            while s.held and (s.in_flight == 0 or s.in_flight + s.held[0][3] <= s.window):
                _, _, held_rid, held_bytes, message = heapq.heappop(s.held)
                s.sent[held_rid] = held_bytes
                s.in_flight += held_bytes
                self.outstanding += 1
                if s.in_flight > self.stats.peak_bytes:
                    self.stats.peak_bytes = s.in_flight
                released.append(message)
            return released

    def forget(self, peer: K) -> None:
        """``peer`` died: drop its held messages (a worker's pushes fail and go to the
        new owners, through the gate again) and the bytes it never credited. Never blocks
        (beyond the lock)."""
        with self._lock:
            s = self._peers.pop(peer, None)
            if s is not None:
                self.outstanding -= len(s.sent)

    def holding(self) -> bool:
        """Whether any message is held back for credit. Never blocks (beyond the lock)."""
        with self._lock:
            return any(s.held for s in self._peers.values())

    def in_flight(self, peer: K) -> int:
        """The bytes sent to ``peer`` and not yet credited. Never blocks."""
        with self._lock:
            s = self._peers.get(peer)
            return 0 if s is None else s.in_flight

    def describe(self) -> str:
        """Bytes in flight and messages held, per peer, for a hung job's dump."""
        with self._lock:
            parts = [
                f"{name}: {s.in_flight} bytes in flight, {len(s.held)} held"
                for name, s in self._peers.items()
                if s.in_flight or s.held
            ]
        return "credit: " + ("; ".join(parts) if parts else "nothing in flight")

    def _take(self, s: _Peer[M], rid: int, nbytes: int) -> None:
        s.sent[rid] = nbytes
        s.in_flight += nbytes
        self.outstanding += 1
        self.stats.peak_bytes = max(self.stats.peak_bytes, s.in_flight)
