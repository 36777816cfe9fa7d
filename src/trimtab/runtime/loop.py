"""What every node's event loop shares: framing replies and errors, heartbeats."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from trimtab.protocol.headers import HeartbeatHeader, heartbeat, read_clock
from trimtab.protocol.messages import Header, WireHeader, encode, error_header
from trimtab.runtime.trace import Trace
from trimtab.transport import Frame, Peer, Transport


class NodeLoop:
    """Helpers for a node's single-threaded event loop over a :class:`Transport`.

    Not thread-safe: only the loop's thread uses it.
    """

    def __init__(self, job: str, transport: Transport, log: logging.Logger) -> None:
        self.job = job
        self.transport = transport
        self.log = log
        self.errors_sent = 0
        #: Replies owed to the parts of batches (a server's: :mod:`trimtab.protocol.batch`):
        #: ``(peer, request id) -> keep(peer, header, frames)``, which takes the reply
        #: into its batch instead of sending it.
        self.gathered: dict[tuple[Peer, int], Callable[[Peer, Any, Sequence[Frame]], None]] = {}

    def send(self, peer: Peer, header: Header | WireHeader, frames: Sequence[Frame] = ()) -> None:
        """Send ``header`` (a builder's typed header of :mod:`trimtab.protocol.headers`,
        or a plain dict), stamped with this job's ``j``, and ``frames`` to ``peer`` (or
        into the batch it answers a part of: :attr:`gathered`). Blocks only as
        :meth:`Transport.send` does."""
        header["j"] = self.job
        if self.gathered:
            keep = self.gathered.pop((peer, header.get("i", 0)), None)
            if keep is not None:
                keep(peer, header, frames)
                return
        self.transport.send(peer, [encode(header), *frames])

    def refuse(self, peer: Peer, rid: int, code: str, msg: str, *, data: bool) -> None:
        """Answer a request with an error; the node goes on serving."""
        self.errors_sent += 1
        self.log.warning("refused a request from %r: [%s] %s", peer, code, msg)
        self.send(peer, error_header(self.job, rid, code, msg, data=data))


class Heartbeat:
    """Sends HEARTBEAT to the coordinator every ``interval_s`` and notices its silence.

    Traced, each heartbeat carries its send time and the coordinator's echo is one
    sample of the trace's clock sync (:meth:`echoed`)."""

    def __init__(self, interval_s: float, timeout_s: float) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        now = time.monotonic()
        self._last_sent = 0.0
        self.last_heard = now

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last_sent >= self.interval_s:
            self._last_sent = now
            return True
        return False

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard

    def gone(self, closed: Iterable[Peer], coordinator: Peer) -> str | None:
        """Why the coordinator is gone, or None: its connection is among ``closed``
        (the transport's ``lost()``: it exited or was killed, seen at once), or it has
        been silent for more than ``timeout_s``. Never blocks."""
        if coordinator in closed:
            return "the coordinator's connection closed (it exited or was killed)"
        if self.silent_for() > self.timeout_s:
            return f"the coordinator has been silent for {self.silent_for():.0f}s"
        return None

    def header(self, trace: Trace | None = None) -> HeartbeatHeader:
        """A server's HEARTBEAT (a worker's carries its floor: ``worker_heartbeat``),
        with its send time on ``trace``'s clock where traced."""
        return heartbeat(sent=None if trace is None else trace.now())

    @staticmethod
    def echoed(header: Header, trace: Trace | None) -> None:
        """The coordinator's echo of a heartbeat: a clock-sync sample of ``trace``."""
        pair = None if trace is None else read_clock(header)
        if trace is not None and pair is not None:
            trace.sync.add(pair[0], pair[1], trace.now())
