"""What a server measures of its own load, for PSLD: one place that counts."""

from __future__ import annotations


class LoadMeter:
    """A server's cumulative load: busy seconds, bytes moved (and of them, those sent:
    ``bytes_out``), requests served, and its step, the figures every LOAD report carries.

    Bytes are what the server moves both ways, whether a socket or a worker's shared
    memory carried them (what a network would have carried), so the speed figure
    (bytes per busy second) does not depend on the path. Not thread-safe: the server's
    loop thread owns it. Nothing here blocks or raises.
    """

    __slots__ = ("busy_s", "bytes", "bytes_out", "requests", "step")

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.bytes = 0
        self.bytes_out = 0
        self.requests = 0
        #: The highest clock completed on any chunk the server owns, or the job's clock
        #: the coordinator told it, whichever is higher.
        self.step = 0

    def count(self, nbytes: int) -> None:
        """Count ``nbytes`` moved outside a served request's frames (a value sent, a
        gradient read from shared memory)."""
        self.bytes += nbytes

    def sent(self, nbytes: int) -> None:
        """Count ``nbytes`` sent (a value, rows): moved, and out."""
        self.bytes += nbytes
        self.bytes_out += nbytes

    def served(self, busy_s: float, nbytes: int) -> None:
        """Count one request served: ``busy_s`` seconds handling its ``nbytes``."""
        self.busy_s += busy_s
        self.bytes += nbytes
        self.requests += 1

    def stalled(self, seconds: float) -> None:
        """Count ``seconds`` spent on the server's traffic outside its handlers (a
        transport pacing a slow link) as busy."""
        self.busy_s += seconds

    def advance(self, step: int) -> bool:
        """Raise the step to ``step``; whether it rose."""
        if step > self.step:
            self.step = step
            return True
        return False
