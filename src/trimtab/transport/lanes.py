"""A :class:`~trimtab.transport.zmq.ZmqTransport`'s local-lane connections: the ones it
opened (by address) and the ones it accepted (by identity), its listener, and how each
is read, written and dropped. The wire format and one connection's handshake are
:mod:`trimtab.transport.lane`'s; this module is the set of them, polled beside the
transport's ZeroMQ sockets on the transport's one poller.

Not thread-safe: the transport's owning thread uses it. Nothing here blocks but
:meth:`Lanes.close` (up to its linger).
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import time
from collections.abc import Callable, Sequence

import zmq

from trimtab.transport.auth import ClientHandshake, JobKey, ServerHandshake
from trimtab.transport.base import Envelope, Frame, Peer, in_peer, out_peer
from trimtab.transport.lane import LaneClosed, LaneConnection, LaneRefused, lane_name
from trimtab.transport.limits import Limits
from trimtab.transport.sessions import MAX_UNPROVEN

log = logging.getLogger("trimtab.transport")


class Lanes:
    """The lane connections of one transport.

    Args:
        poller: the transport's poller, which polls each connection's descriptor.
        ready: where messages read off a lane are queued for the node.
        key: the job's key (each connection's handshake), or None.
        limits: what one inbound message may be.
        refuse: counts a refusal (a handshake that failed) with who and why.

    Attributes:
        gone: peers whose lane closed, oldest first (bounded: a node that never asks).
        lost: addresses of our connections that broke (reconnected on the next send).
    """

    def __init__(
        self,
        poller: zmq.Poller,
        ready: collections.deque[Envelope],
        key: JobKey | None,
        limits: Limits,
        refuse: Callable[[object, str], None],
    ) -> None:
        self._poller = poller
        self._ready = ready
        self._key = key
        self._limits = limits
        self._refuse = refuse
        self.out: dict[str, LaneConnection] = {}  # ours, by address
        self.into: dict[bytes, LaneConnection] = {}  # theirs, by identity
        self.fds: dict[int, LaneConnection] = {}
        self.gone: collections.deque[Peer] = collections.deque(maxlen=4096)
        self.lost: set[str] = set()
        self._ids = itertools.count(1)
        self._scratch = memoryview(bytearray(0))
        self.listener: socket.socket | None = None

    def listen(self, address: str) -> None:
        """Listen on ``address``'s lane name; a warning, and no lane, if it is taken."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(lane_name(address))
            listener.listen(128)
        except OSError as exc:  # unusual (another process has the name): TCP still works
            log.warning("no local lane for %s: %s", address, exc)
            listener.close()
            return
        listener.setblocking(False)
        self.listener = listener
        self._poller.register(listener.fileno(), zmq.POLLIN)

    def connect(self, address: str) -> Peer | None:
        """Open a lane to ``address``'s listener; its peer, or None where nobody
        listens (lane off there, not up yet, or its process died: ZeroMQ then)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(lane_name(address))
        except OSError:
            sock.close()
            return None
        shake = ClientHandshake(self._key) if self._key is not None else None
        try:
            conn = LaneConnection(sock, out_peer(address), self._limits, shake)
        except LaneClosed:  # its listener went as we connected (its process died)
            sock.close()
            return None
        self.out[address] = conn
        self._add(conn)
        return conn.peer

    def forget(self, address: str) -> None:
        """Close our lane to ``address`` (what waits on it is dropped), if any."""
        conn = self.out.pop(address, None)
        if conn is not None and self.fds.pop(conn.fd, None) is not None:
            self._poller.unregister(conn.fd)
            conn.close()
        self.lost.discard(address)

    def _add(self, conn: LaneConnection) -> None:
        self.fds[conn.fd] = conn
        self._poller.register(conn.fd, zmq.POLLIN | (zmq.POLLOUT if conn.queued else 0))
        if not self._scratch:
            self._scratch = memoryview(bytearray(1 << 18))

    def send(self, conn: LaneConnection, frames: Sequence[Frame]) -> None:
        """Write ``frames`` to ``conn`` (queued where the kernel cannot take them yet)."""
        try:
            if conn.send(frames):
                self._poller.register(conn.fd, zmq.POLLIN | zmq.POLLOUT)
        except LaneClosed as exc:
            self.drop(conn, str(exc))

    def on_ready(self, fd: int, events: int) -> bool:
        """``fd`` is ready: read its connection, or accept on the listener. False if
        ``fd`` is none of the lanes'."""
        conn = self.fds.get(fd)
        if conn is not None:
            self._on_lane(conn, events)
            return True
        if self.listener is not None and fd == self.listener.fileno():
            self._accept()
            return True
        return False

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the peer falls back to nothing
                log.warning("local lane: could not accept a connection: %s", exc)
                return
            identity = b"lane-%d" % next(self._ids)
            shake = ServerHandshake(self._key) if self._key is not None else None
            conn = LaneConnection(sock, in_peer(identity), self._limits, shake)
            unproven = [c for c in self.into.values() if not c.proven]
            if len(unproven) >= MAX_UNPROVEN:  # a flood of silent connections: oldest out
                self.drop(unproven[0], "it did not complete its handshake")
            self.into[identity] = conn
            self._add(conn)

    def _on_lane(self, conn: LaneConnection, events: int) -> None:
        try:
            if events & zmq.POLLOUT and not conn.flush():
                self._poller.register(conn.fd, zmq.POLLIN)
            if events & (zmq.POLLIN | zmq.POLLERR):
                messages, closed = conn.read(self._scratch)
                for frames in messages:
                    self._ready.append(Envelope(conn.peer, frames))
                if closed:
                    self.drop(conn, "")
                elif conn.queued:  # the handshake ended: what waited for it is queued
                    self._poller.register(conn.fd, zmq.POLLIN | zmq.POLLOUT)
        except LaneRefused as exc:
            self._refuse(conn.peer, str(exc))
            self.drop(conn, "")
        except LaneClosed as exc:
            self.drop(conn, str(exc))
        except Exception as exc:  # MemoryError too: a peer never ends the process
            log.warning("local lane to %r: closed after %r", conn.peer, exc)
            self.drop(conn, "")

    def drop(self, conn: LaneConnection, why: str) -> None:
        """Close ``conn`` (logging ``why`` if given) and note its peer as gone."""
        if why:
            log.warning("local lane to %r closed: %s", conn.peer, why)
        if self.fds.pop(conn.fd, None) is None:
            return
        self._poller.unregister(conn.fd)
        self.gone.append(conn.peer)
        if conn.peer.startswith(b"i:"):
            self.into.pop(conn.peer[2:], None)
        else:
            address = conn.peer[2:].decode()
            self.out.pop(address, None)
            self.lost.add(address)
        conn.close()

    @property
    def waiting(self) -> bool:
        """Whether a connection holds messages waiting for its handshake."""
        return any(c.waiting for c in self.fds.values())

    def close(self, deadline: float) -> None:
        """Close every connection, giving queued messages until ``deadline``
        (``time.monotonic()``) to leave, and the listener. Blocks that long at most."""
        for conn in list(self.fds.values()):
            conn.close(linger_s=max(0.0, deadline - time.monotonic()))
        self.fds.clear()
        self.into.clear()
        self.out.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
