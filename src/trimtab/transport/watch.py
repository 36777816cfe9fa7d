"""Which ZeroMQ peers' TCP connections closed, seen as it happens.

libzmq 4.3 tells a ROUTER's owner nothing when a peer goes (``ZMQ_ROUTER_NOTIFY`` is a
draft option, not built into pyzmq's libzmq). Its socket monitor does report each
``DISCONNECTED`` connection, by file descriptor; and each message received says which
descriptor it came through (``SRCFD``). A :class:`DisconnectWatch` joins the two: the
descriptor of each peer's first message, then the peer whose descriptor disconnected.
A DEALER has one peer, so its monitor's ``DISCONNECTED`` names that peer outright, and
its ``CONNECTED`` says whether its connection ever came up (:attr:`connected`).

Not thread-safe: the transport's owning thread uses it. Nothing blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping

import zmq
from zmq.utils.monitor import parse_monitor_message

from trimtab.transport.base import Peer


class DisconnectWatch:
    """The monitor of one ZeroMQ socket.

    Args:
        sock: the ROUTER or DEALER socket watched.
        peer: for a DEALER, its one peer; None for a ROUTER (peers learned by
            :meth:`seen`).
    """

    def __init__(self, sock: zmq.Socket[bytes], peer: Peer | None = None) -> None:
        events = zmq.EVENT_DISCONNECTED | (zmq.EVENT_CONNECTED if peer is not None else 0)
        self.monitor: zmq.Socket[bytes] = sock.get_monitor_socket(events)
        #: The monitor's mailbox descriptor (ZMQ_FD), to poll it by (see :meth:`closed`).
        self.fd = int(self.monitor.get(zmq.FD))
        #: A DEALER's: whether its connection came up, as of the last :meth:`closed`,
        #: and when the watch began (``time.monotonic()``).
        self.connected = False
        self.since = time.monotonic()
        self._sock = sock
        self._peer = peer
        self._by_fd: dict[int, Peer] = {}
        self._fd_of: dict[Peer, int] = {}
        #: The peers whose descriptor is noted (:meth:`seen` returns at once for them):
        #: its caller may skip the call. Read-only.
        self.known: Mapping[Peer, int] = self._fd_of
        self._gone: list[Peer] = []
        # Descriptors reused before their DISCONNECTED event was read: that event is old.
        self._stale: dict[int, int] = {}
        # Read once now: a ZMQ_FD wakes for a message only once its reader found the
        # monitor empty, so its transport may poll that descriptor from here on.
        self._gone = self.closed()

    def seen(self, peer: Peer, frame: zmq.Frame) -> None:
        """A message from ``peer`` arrived in ``frame`` (a ROUTER's): note its
        connection's descriptor, once per peer."""
        if peer in self._fd_of:
            return
        with contextlib.suppress(zmq.ZMQError, ValueError):
            fd = int(frame.get(zmq.SRCFD))
            old = self._by_fd.get(fd)
            if old is not None:  # its connection closed, and the descriptor is reused
                del self._fd_of[old]
                self._gone.append(old)
                self._stale[fd] = self._stale.get(fd, 0) + 1
            self._fd_of[peer] = fd
            self._by_fd[fd] = peer

    def closed(self) -> list[Peer]:
        """The peers whose connection closed since the last call. Never blocks."""
        gone, self._gone = self._gone, []
        while True:
            try:
                message = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return gone
            event = parse_monitor_message(message)
            if event["event"] == zmq.EVENT_CONNECTED:
                self.connected = True
                continue
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            if self._peer is not None:
                gone.append(self._peer)
                continue
            fd = int(event["value"])
            if self._stale.get(fd):
                self._stale[fd] -= 1
                continue
            peer = self._by_fd.pop(fd, None)
            if peer is not None:
                del self._fd_of[peer]
                gone.append(peer)

    def close(self) -> None:
        """Stop monitoring. Idempotent."""
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self.monitor.close(linger=0)
