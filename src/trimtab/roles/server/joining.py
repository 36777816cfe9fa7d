"""What a server holds while it joins: the data messages that reach it before its
REGISTERED does.

A server learns the job's member key (which every credential a peer shows is checked
against) from the coordinator's REGISTERED. Its peers learn of it from other messages:
a primary told to replicate to a server that just joined (a replacement, named a
backup) may send its first REPLICATE before that server has read its REGISTERED, since
no order holds between two sockets. Refused, that REPLICATE would end the job
("replication refused by the backup"). So the messages of data peers that come while
the server is JOINING are kept, copied (a lane's frames are views of a buffer it
reuses), and served in their order once it is registered. Every connection they came
through proved the job's secret already; the hold is bounded all the same.
"""

from __future__ import annotations

from trimtab.protocol.messages import Header
from trimtab.transport import Peer

#: The most messages held before the server is registered (a peer flooding a server
#: that never registers would otherwise grow it without bound); past it, they are
#: served at once, and refused for what they lack.
HOLD_MAX = 4096
#: The most bytes held (their frames), likewise.
HOLD_MAX_BYTES = 256 << 20

Held = tuple[Peer, list[memoryview], Header | None]


class Joining:
    """The messages held while the server joins. Not thread-safe: the server's loop
    owns it."""

    def __init__(self) -> None:
        self._held: list[Held] = []
        self._bytes = 0

    def hold(self, peer: Peer, frames: list[memoryview], header: Header | None) -> bool:
        """Keep a copy of a data peer's message to serve once registered; ``False`` (and
        nothing kept) past :data:`HOLD_MAX` messages or :data:`HOLD_MAX_BYTES`. Never
        blocks or raises."""
        nbytes = sum(f.nbytes for f in frames)
        if len(self._held) >= HOLD_MAX or self._bytes + nbytes > HOLD_MAX_BYTES:
            return False
        self._held.append((peer, [memoryview(bytes(f)) for f in frames], header))
        self._bytes += nbytes
        return True

    def release(self) -> list[Held]:
        """The messages held, in the order they came, to serve now; holds none after.
        Never blocks."""
        held, self._held, self._bytes = self._held, [], 0
        return held
