"""The transport contract.

A transport moves *messages* (lists of frames) between nodes. A node may bind an
address others connect to; it connects out to the addresses it needs. Every message
received comes with the :data:`Peer` it came from, and replying to that peer reaches the
sender, whichever side opened the connection.

Threading: one thread at a time (the node's I/O thread, or whoever holds the lock that
guards the transport) calls ``connect``, ``send``, ``recv`` and ``close``; only
:meth:`Transport.wake` may be called from any thread at any time.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import NamedTuple

#: Opaque, hashable name of a peer: ``b"o:" + address`` for a peer we connected to,
#: ``b"i:" + identity`` for a peer that connected to us.
Peer = bytes

Frame = bytes | memoryview


def out_peer(address: str) -> Peer:
    """The peer name for a connection we open to ``address``."""
    return b"o:" + address.encode()


def in_peer(identity: bytes) -> Peer:
    """The peer name for a connection a remote node opened to us."""
    return b"i:" + identity


class Envelope(NamedTuple):
    """A received message: who sent it and its frames (header first)."""

    peer: Peer
    frames: list[memoryview]


class Transport(abc.ABC):
    """Framed, ordered, reliable messaging between nodes (per pair of peers).

    Attributes:
        spin_s: seconds a :meth:`recv` that has to wait polls before it sleeps (0: it
            sleeps at once). Its owner sets it; transports that cannot poll ignore it.
    """

    spin_s: float = 0.0
    #: The peers lost and not yet returned by :meth:`lost`, as a live view (a sequence
    #: the transport fills and :meth:`lost` empties, never replaced), so that a loop can see
    #: a closed connection at once without a call a turn; ``None`` where a transport
    #: cannot show them so (its :meth:`lost` is then to be called every turn).
    pending_lost: Sequence[Peer] | None = None

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """The address peers connect to, or ``""`` if this transport does not bind."""

    @abc.abstractmethod
    def connect(self, address: str) -> Peer:
        """Open (once) a connection to ``address``; return its peer name. Does not block."""

    def reconnect(self, address: str) -> Peer:
        """Connect to ``address`` afresh, as to a new peer: a process that replaced the
        one that was there (a coordinator's failover) shares no session with the old
        one. What was queued for the old connection is dropped. Returns the same peer
        as :meth:`connect`. Never blocks."""
        return self.connect(address)

    @abc.abstractmethod
    def send(self, peer: Peer, frames: Sequence[Frame]) -> None:
        """Queue a message to ``peer``. Frames may be sent without copying, so the caller
        must not modify their memory until the peer has answered. Blocks only when the
        outgoing queue is full. Raises ``KeyError`` for a peer never connected or seen."""

    def send_to(self, address: str, frames: Sequence[Frame]) -> None:
        """``send(connect(address), frames)``: queue a message to the node at
        ``address``, connecting first if need be; a transport may do it more cheaply
        (a data path's per-message call). Blocks and raises as :meth:`send`."""
        self.send(self.connect(address), frames)

    @abc.abstractmethod
    def recv(self, timeout_s: float | None) -> Envelope | None:
        """Return the next message, or ``None`` after ``timeout_s`` or a :meth:`wake`.
        Blocks up to ``timeout_s`` (forever for ``None``)."""

    def recv_burst(self, timeout_s: float | None, limit: int) -> list[Envelope]:
        """What :meth:`recv` returns and, behind it, what else this transport holds or
        read with it, up to ``limit`` messages (each peer's in its order): a burst its
        receiver handles as one (orders, answers together). Empty after ``timeout_s`` or
        a :meth:`wake`. Blocks as :meth:`recv`."""
        env = self.recv(timeout_s)
        if env is None:
            return []
        burst = [env]
        while len(burst) < limit:
            env = self.recv_queued()
            if env is None:
                break
            burst.append(env)
        return burst

    def through_lane(self, peer: Peer) -> bool:
        """Whether messages to and from ``peer`` skip the network stack (a transport's
        same-machine path, e.g. :mod:`trimtab.transport.lane`). Never blocks."""
        return False

    def recv_queued(self) -> Envelope | None:
        """The next message this transport already holds, if any: cheaper than
        ``recv(0)`` where a transport receives in bursts (it need not ask the network).
        Never blocks."""
        return self.recv(0)

    def lost(self) -> list[Peer]:
        """The peers whose connection closed (the process at the other end exited,
        or was killed) since the last call, oldest first; a transport that cannot
        tell returns none. A peer that is merely slow keeps its connection, so it is
        never listed. Never blocks."""
        return []

    @abc.abstractmethod
    def wake(self) -> None:
        """Make a blocked :meth:`recv` return ``None`` soon. Thread-safe, never blocks."""

    @abc.abstractmethod
    def companion(self) -> Transport:
        """A new, non-binding transport of the same kind for another thread's own
        connections (it shares this one's resources, e.g. ZeroMQ's I/O thread). Close
        it separately. Does not block."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets. Queued messages get a short grace period to leave."""
