"""What arrives on a ZeroMQ transport's sockets: each message read off its ROUTER or one
of its DEALERs, checked against the limits, opened (its MAC and sequence, with the job's
key) and queued for the node, or answered (a handshake's step) or refused and counted.

:class:`~trimtab.transport.zmq.ZmqTransport` polls; these functions read a socket the
poll found ready, up to :data:`BURST` messages, in one loop without a Python call a
message beyond the checks (the data path's every message comes this way). Nothing a
peer sends makes them raise.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from functools import partial
from typing import cast

import zmq
import zmq.backend

from trimtab.transport.auth import AuthRefused
from trimtab.transport.base import Envelope, Peer
from trimtab.transport.frames import EVENTS, POLLIN, recv_buffers, recv_routed, send_frames
from trimtab.transport.sessions import ZmqSessions
from trimtab.transport.watch import DisconnectWatch

__all__ = ["BURST", "DealerReads", "read_dealer", "read_router"]

#: How many messages one ready socket may yield per poll before others get a turn.
BURST = 64
#: ``Envelope(peer, frames)`` made in C (the named tuple's ``__new__`` is a Python
#: function: a call a message received).
_envelope = cast(
    Callable[[tuple[Peer, list[memoryview]]], Envelope], partial(tuple.__new__, Envelope)
)
#: pyzmq's compiled poll, and its option read (``Socket.get`` without its Python
#: wrapper; it still looks the option up in pyzmq's enum, two Python calls): whether a
#: socket has more queued is asked with them.
_POLL = zmq.backend.zmq_poll
_GET = cast(Callable[[zmq.Socket[bytes], int], int], zmq.backend.Socket.get)


def read_router(
    router: zmq.Socket[bytes],
    sessions: ZmqSessions,
    ready: collections.deque[Envelope],
    watch: DisconnectWatch,
) -> None:
    """Read up to :data:`BURST` messages off ``router``: each checked and opened
    (:meth:`ZmqSessions.on_router`'s checks) and appended to ``ready``, or answered (a
    handshake's step) or dropped; a peer seen for the first time is told to ``watch``.
    Never blocks; never raises for what a peer sent."""
    on_router, proven, most = sessions.on_router, sessions.proven_in, sessions.most_bytes
    known = watch.known
    for _ in range(BURST):
        try:
            identity, buffers, last = recv_routed(router)
        except zmq.Again:
            return
        if buffers:
            n = len(buffers)
            session = proven.get(identity)
            if (
                session is None  # (no key, or a handshake: on_router's every check)
                or n > 2
                or buffers[0].nbytes + (buffers[1].nbytes if n == 2 else 0) > most
            ):
                frames, reply = on_router(identity, buffers)
            else:  # a proven peer's message within the limits: on_router's, inlined
                reply = None
                try:
                    frames = session.open(buffers)
                except AuthRefused as exc:
                    sessions.refuse(identity, str(exc))
                    frames = None
            if reply is not None:
                router.send_multipart([identity, *reply])
            if frames is not None:
                peer = b"i:" + identity  # (in_peer)
                ready.append(_envelope((peer, frames)))
                if peer not in known:
                    watch.seen(peer, last)
        # Asking is cheaper than the exception a receive on an empty socket raises;
        # its EVENTS is one look at its mailbox (getpid, poll), zmq_poll's two polls.
        if not _GET(router, EVENTS) & POLLIN:
            return


def read_dealer(
    dealer: zmq.Socket[bytes],
    address: str,
    peer: Peer,
    sessions: ZmqSessions,
    check: Callable[[list[memoryview]], str],
    keyed: bool,
    ready: collections.deque[Envelope],
) -> bool:
    """Read up to :data:`BURST` messages off ``dealer`` (our connection to ``address``,
    named ``peer``), as :func:`read_router` (:meth:`ZmqSessions.on_dealer`'s checks:
    ``check``, the limits, then the session's MAC where ``keyed``). Never blocks; never
    raises for what a peer sent.

    Returns whether it stopped with messages maybe left (:data:`BURST` read): False
    means the socket was found empty after the last thing done on it (its last
    receive, or its EVENTS looked at after a handshake's reply was sent), so its
    ZMQ_FD signals the next message (see :class:`DealerReads`).
    """
    proven = sessions.proven_out
    for _ in range(BURST):
        try:
            buffers = recv_buffers(dealer)
        except zmq.Again:
            return False
        session = proven.get(address) if keyed else None
        if keyed and session is None:  # a handshake's step, or a stranger's message
            frames, out = sessions.on_dealer(address, buffers)
            for message in out:
                send_frames(dealer, message)
        else:  # (on_dealer's every data message, inlined: the same checks)
            frames = None
            why = check(buffers)
            if why:
                sessions.refuse(address, why)
            elif session is None:
                frames = buffers
            else:
                try:
                    frames = session.open(buffers)
                except AuthRefused as exc:
                    sessions.refuse(address, str(exc))
        if frames is not None:
            ready.append(_envelope((peer, frames)))
        # Asking is cheaper than the exception a receive on an empty socket raises (and
        # comes after any reply sent above: an empty answer leaves the ZMQ_FD armed).
        if not _POLL([(dealer, POLLIN)], 0):
            return False
    return True


class DealerReads:
    """A ZeroMQ transport's DEALERs as they are read: each through :func:`read_dealer`,
    and, where they are polled by their ZMQ_FD (``by_fd``), which of them a wait must
    look at first.

    ``zmq_poll`` asks each ZeroMQ socket in it its EVENTS (a getpid and a poll) on each
    of its two passes; a raw descriptor costs it nothing more. A DEALER's ZMQ_FD is
    edge-triggered: it signals a message only when the socket was found empty since it
    last took a command, and any operation on the socket (a send, a receive, an EVENTS
    look) may take the command that says a message came, leaving the message readable
    but the descriptor quiet. So a DEALER sent on, made, or read but not to its end is
    *unsure* (:attr:`unsure`) until its EVENTS is looked at, which the transport's every
    wait does first (:meth:`settle`): one look a wait for a socket sent on, none for one
    that was not, where ``zmq_poll`` looked twice at each.

    Its transport's thread only. Nothing here blocks or raises for what a peer sent.

    Args:
        sessions: the transport's sessions (the handshakes and MACs).
        check: why a message is over the limits, or ``""`` (``Limits.check_frames``).
        keyed: whether the job has a key (every message is MACed).
        ready: the transport's queue of messages for the node.
        by_fd: whether the transport polls its DEALERs by their ZMQ_FD.
    """

    def __init__(
        self,
        sessions: ZmqSessions,
        check: Callable[[list[memoryview]], str],
        keyed: bool,
        ready: collections.deque[Envelope],
        by_fd: bool,
    ) -> None:
        self._sessions, self._check, self._keyed, self._ready = sessions, check, keyed, ready
        self.by_fd = by_fd
        #: Each DEALER's peer, and the address it is connected to (the transport's to fill).
        self.peer: dict[zmq.Socket[bytes], Peer] = {}
        self.address: dict[zmq.Socket[bytes], str] = {}
        #: DEALERs whose ZMQ_FD may not signal what they hold (the transport adds each it
        #: makes or sends on, where ``by_fd``).
        self.unsure: set[zmq.Socket[bytes]] = set()

    def read(self, dealer: zmq.Socket[bytes]) -> None:
        """Read ``dealer`` (:func:`read_dealer`); unsure again if polled by its ZMQ_FD
        and it stopped before its end."""
        more = read_dealer(
            dealer,
            self.address[dealer],
            self.peer[dealer],
            self._sessions,
            self._check,
            self._keyed,
            self._ready,
        )
        if more and self.by_fd:
            self.unsure.add(dealer)

    def settle(self) -> None:
        """Look at each unsure DEALER's EVENTS and read those that hold messages, so that
        after it every DEALER's ZMQ_FD signals its next message, but those that held
        more than a burst (still unsure: the wait after it should not sleep)."""
        unsure = list(self.unsure)
        self.unsure.clear()
        for dealer in unsure:
            # An EVENTS look takes the socket's commands; no POLLIN then arms its FD.
            if _GET(dealer, EVENTS) & POLLIN:
                self.read(dealer)  # (unsure again if it read only a burst)
