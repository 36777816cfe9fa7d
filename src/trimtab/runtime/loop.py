"""What every node's event loop shares: framing replies and errors, heartbeats."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from trimtab.protocol.messages import Control, Header, WireHeader, encode, error_header
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

    def send(self, peer: Peer, header: Header | WireHeader, frames: Sequence[Frame] = ()) -> None:
        header["j"] = self.job
        self.transport.send(peer, [encode(header), *frames])

    def refuse(self, peer: Peer, rid: int, code: str, msg: str, *, data: bool) -> None:
        """Answer a request with an error; the node goes on serving."""
        self.errors_sent += 1
        self.log.warning("refused a request from %r: [%s] %s", peer, code, msg)
        self.transport.send(peer, [encode(error_header(self.job, rid, code, msg, data=data))])


class Heartbeat:
    """Sends HEARTBEAT to the coordinator every ``interval_s`` and notices its silence."""

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

    def header(self) -> dict[str, Any]:
        return {"o": int(Control.HEARTBEAT), "i": 0}
