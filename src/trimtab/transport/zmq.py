"""The real transport: ZeroMQ over TCP.

A node that serves binds one ROUTER socket; every connection it opens is a DEALER.
Tensor frames are sent with ``copy=False`` (pyzmq copies only frames below its
``copy_threshold``) and received as ``zmq.Frame`` objects exposed as memoryviews, so
the bytes are not copied again in Python.

A pipe wakes the poller, so other threads can hand the I/O thread work without a
socket of their own (ZeroMQ sockets must stay on one thread).

The ROUTER is polled as a ZeroMQ socket; a transport that binds (a server's) polls its
DEALERs by their ZMQ_FD (:class:`~trimtab.transport.zmq_in.DealerReads` says why, and
how no message is missed).

Between processes of one machine, messages take the local lane instead
(:mod:`trimtab.transport.lane`): Unix-domain sockets polled beside the ZeroMQ ones, which
skip ZeroMQ's I/O threads (:mod:`trimtab.transport.lanes` holds a transport's set of
them). Peers are named the same whichever way their messages go.

With the job's key (:class:`~trimtab.transport.auth.JobKey`) every connection, lane or
TCP, proves the secret before anything it sends is parsed, and every message carries a
MAC (:mod:`trimtab.transport.auth`); libzmq refuses TCP connections without the job's
credentials itself (:mod:`trimtab.transport.zap`). Without a key (``TRIMTAB_AUTH=0``,
tests) there is neither: any local user can then corrupt or stop the job.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.backend

from trimtab.transport.alloc import keep_freed_memory
from trimtab.transport.auth import JobKey
from trimtab.transport.base import Envelope, Frame, Peer, Transport, out_peer
from trimtab.transport.frames import SNDMORE, send_frames
from trimtab.transport.lane import LANE_ENV, lane_from_env, supported
from trimtab.transport.lanes import Lanes
from trimtab.transport.limits import Limits
from trimtab.transport.sessions import ZmqSessions
from trimtab.transport.shm import is_local
from trimtab.transport.spin import (
    SPIN_DEFAULT_US,
    SPIN_ENV,
    SpinPolicy,
    check_spin,
    parse_spin,
    poll_spinning,
    spin_from_env,
)
from trimtab.transport.watch import DisconnectWatch
from trimtab.transport.zap import SharedContext, secure_client, secure_server
from trimtab.transport.zmq_in import DealerReads, read_router

__all__ = [
    "LANE_ENV",
    "SPIN_DEFAULT_US",
    "SPIN_ENV",
    "ZmqTransport",
    "check_spin",
    "keep_freed_memory",
    "lane_from_env",
    "parse_spin",
    "spin_from_env",
]

log = logging.getLogger("trimtab.transport")

#: pyzmq's compiled poll (a wait without spinning calls it directly: a call a turn).
_POLL = zmq.backend.zmq_poll
#: pyzmq's compiled send, unbound (as :func:`~trimtab.transport.frames.send_frames`).
_SEND = zmq.backend.Socket.send
#: Seconds a closing transport gives queued lane messages to leave (as ZeroMQ's LINGER).
_LINGER_S = 2.0
#: A ZeroMQ connection not up this long after it was made has nobody listening (on a
#: loopback or a LAN it comes up within milliseconds): closing does not linger for it.
_CONNECT_S = 1.0


class ZmqTransport(Transport):
    """A :class:`Transport` over ZeroMQ TCP sockets.

    Args:
        bind: bind a ROUTER socket so peers can connect to this node.
        host: the interface to bind; loopback by default.
        port: the port to bind; 0 picks a free one.
        max_frame_bytes: an inbound frame over this closes that peer's connection
            (ZeroMQ's MAXMSGSIZE), so a runaway sender cannot exhaust memory; ``None``
            for ``limits``'.
        auth: the job's key: every connection proves it, every message is MACed.
            ``None``: no authentication (INSECURE; tests and ``TRIMTAB_AUTH=0``).
        limits: what one inbound message may be (:meth:`Limits.for_job` for a node that
            knows its job's chunk size); checked before allocation where the wire allows.
        reuse_buffers: tune the process's allocator so received frames reuse freed
            memory (:func:`keep_freed_memory`).
        lane: listen on, and connect through, the local lane for peers on this
            machine's loopback, where the platform has it. The transport reads no
            environment variable: an edge passes :func:`lane_from_env`'s answer.
        spin_s: seconds a :meth:`recv` that has to wait polls before it sleeps
            (:attr:`Transport.spin_s`; ``TRIMTAB_SPIN_US`` at the edges).
        dealers_by_fd: poll each DEALER by its ZMQ_FD (:class:`DealerReads`), not as a
            ZeroMQ socket; None: where it binds. A worker's transports send on their
            DEALERs once a chunk and wait after each send, so the EVENTS look before
            each wait would be ``zmq_poll``'s own: they poll them as sockets.

    A lane message the kernel cannot take at once (its socket buffer is full) leaves
    during this transport's later :meth:`recv` calls, which every node makes while it
    waits; ZeroMQ's messages leave from its own I/O thread.
    """

    def __init__(
        self,
        *,
        bind: bool,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int | None = None,
        reuse_buffers: bool = True,
        lane: bool = True,
        spin_s: float = 0.0,
        auth: JobKey | None = None,
        limits: Limits | None = None,
        dealers_by_fd: bool | None = None,
        _shared: SharedContext | None = None,
    ) -> None:
        check_spin(spin_s)
        if reuse_buffers:
            keep_freed_memory()
        limits = limits or Limits()
        if max_frame_bytes is not None:
            limits = dataclasses.replace(limits, max_frame_bytes=max_frame_bytes)
        self._limits = limits
        self._shared = _shared or SharedContext(auth)
        self._key = self._shared.key
        self._sessions = ZmqSessions(self._key, limits)
        self._proven_in = self._sessions.proven_in  # (send's lookup, without a call)
        self._proven_out = self._sessions.proven_out  # (send_to's; read_dealer reads the same dict)
        self._shared.acquire()
        self._closed = False
        self.spin_s = spin_s
        self._ctx = self._shared.ctx
        self._poller = zmq.Poller()
        self._dealers: dict[str, zmq.Socket[bytes]] = {}
        self._dealer_watch: dict[str, DisconnectWatch] = {}
        self._dealer_fd: dict[int, zmq.Socket[bytes]] = {}  # by its ZMQ_FD, as polled
        self._ready: collections.deque[Envelope] = collections.deque()
        self._in = DealerReads(
            self._sessions,
            limits.check_frames,
            self._key is not None,
            self._ready,
            bind if dealers_by_fd is None else dealers_by_fd,
        )
        self._by_fd = self._in.by_fd
        self._unsure = self._in.unsure  # (the same set: a wait looks at it first)
        #: Whether a wait spins (with :attr:`spin_s`), and how its spins fared.
        self.spins = SpinPolicy()
        self._watches: dict[zmq.Socket[bytes], DisconnectWatch] = {}  # by monitor socket
        self._watch_fds: dict[int, DisconnectWatch] = {}  # by its mailbox's descriptor
        self._address = ""
        self._router: zmq.Socket[bytes] | None = None
        if bind:
            self._shared.gate()
            router = self._ctx.socket(zmq.ROUTER)
            self._tune(router)
            if self._key is not None:
                secure_server(router, self._key)
            if port == 0:
                port = router.bind_to_random_port(f"tcp://{host}")
            else:
                router.bind(f"tcp://{host}:{port}")
            self._address = f"tcp://{host}:{port}"
            self._router = router
            self._poller.register(router, zmq.POLLIN)
            self._router_watch = self._watch(DisconnectWatch(router))  # (with the router)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller.register(self._wake_r, zmq.POLLIN)
        # The local lane: its connections, and peers whose lane closed (for lost()).
        self._lane = lane and supported()
        self._lanes = Lanes(self._poller, self._ready, self._key, limits, self._sessions.refuse)
        self._gone = self._lanes.gone
        self.pending_lost = self._gone  # (the same list: lost() empties it in place)
        self._lost = self._lanes.lost  # addresses whose lane broke (reconnected on send)
        self._lane_out = self._lanes.out
        self._lane_in = self._lanes.into
        if bind and self._lane:
            self._lanes.listen(self._address)

    def _tune(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 2000)
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.max_frame_bytes)
        # Bounded queues keep memory in check; the defaults (1000 messages) are fine for
        # chunked tensors of a few MiB each.
        sock.setsockopt(zmq.SNDHWM, 10000)
        sock.setsockopt(zmq.RCVHWM, 10000)

    @property
    def address(self) -> str:
        return self._address

    def connect(self, address: str) -> Peer:
        if address in self._lane_out:
            return out_peer(address)
        if address not in self._dealers and self._lane and is_local(address):
            peer = self._lanes.connect(address)  # None: nobody listens there: ZeroMQ
            if peer is not None:
                return peer
        if address not in self._dealers:
            dealer = self._ctx.socket(zmq.DEALER)
            self._tune(dealer)
            if self._key is not None:
                secure_client(dealer, self._key)
            dealer.connect(address)
            self._dealers[address] = dealer
            self._in.peer[dealer], self._in.address[dealer] = out_peer(address), address
            if self._by_fd:
                fd = int(dealer.get(zmq.FD))
                self._dealer_fd[fd] = dealer
                self._poller.register(fd, zmq.POLLIN)
                self._unsure.add(dealer)  # (its EVENTS never looked at yet)
            else:
                self._poller.register(dealer, zmq.POLLIN)
            self._dealer_watch[address] = self._watch(DisconnectWatch(dealer, out_peer(address)))
            hello = self._sessions.opened(address)
            if hello is not None:
                dealer.send_multipart(hello)
        return out_peer(address)

    def reconnect(self, address: str) -> Peer:
        """As :meth:`Transport.reconnect`: its lane or ZeroMQ socket closed (what waits
        on it dropped), its session forgotten, then :meth:`connect` again."""
        self._lanes.forget(address)
        dealer = self._dealers.pop(address, None)
        if dealer is not None:
            fds = [fd for fd, d in self._dealer_fd.items() if d is dealer]
            for fd in fds:
                del self._dealer_fd[fd]
            self._poller.unregister(fds[0] if fds else dealer)
            del self._in.peer[dealer], self._in.address[dealer]
            self._unsure.discard(dealer)
            watch = self._dealer_watch.pop(address)
            self._poller.unregister(watch.fd)
            del self._watches[watch.monitor], self._watch_fds[watch.fd]
            watch.close()
            dealer.close(linger=0)
        self._sessions.forget(address)
        return self.connect(address)

    def send(self, peer: Peer, frames: Sequence[Frame]) -> None:
        """As :meth:`Transport.send`; also raises :class:`ConfigError` for a message over
        the limits (its receiver would refuse it)."""
        self._limits.check_frames_sent(frames)
        if peer.startswith(b"i:"):
            identity = peer[2:]
            conn = self._lane_in.get(identity)
            if conn is not None:
                self._lanes.send(conn, frames)
                return
            if self._router is None:
                raise KeyError(peer)
            # A lane peer that has gone is unknown to the router, which drops the message
            # as it does for its own departed peers (and so do we, for one never proven).
            if self._key is None:  # (nothing to seal: the data path's every reply)
                send_frames(self._router, [identity, *frames])
                return
            session = self._proven_in.get(identity)
            if session is not None:  # (None: it never proved itself: dropped)
                send_frames(self._router, [identity, *session.seal(frames)])
            return
        address = peer[2:].decode()
        conn = self._lane_out.get(address)
        if conn is not None:
            self._lanes.send(conn, frames)
        elif address in self._dealers:
            self._to_dealer(self._dealers[address], address, frames)
        elif address in self._lost:
            self.connect(address)  # its lane broke: reconnect (the lane, or ZeroMQ)
            self.send(peer, frames)
        else:
            raise KeyError(peer)

    def send_to(self, address: str, frames: Sequence[Frame]) -> None:
        """As :meth:`Transport.send_to`: straight to the address's ZeroMQ socket once
        it has one (and no lane), without naming the peer to find the socket again."""
        dealer = self._dealers.get(address)
        if dealer is None or address in self._lane_out:
            self.send(self.connect(address), frames)
            return
        self._limits.check_frames_sent(frames)
        if self._key is not None:  # (_to_dealer and seal_out, inlined)
            session = self._proven_out.get(address)
            if session is None:  # its handshake is under way: the message waits for it
                self._to_dealer(dealer, address, frames)
                return
            frames = session.seal(frames)
        last = len(frames) - 1  # (send_frames, inlined: a call a message)
        for i, frame in enumerate(frames):
            _SEND(dealer, frame, SNDMORE if i < last else 0, False)
        if self._by_fd:
            self._unsure.add(dealer)  # (a send may take the command its ZMQ_FD signals)

    def _to_dealer(self, dealer: zmq.Socket[bytes], address: str, frames: Sequence[Frame]) -> None:
        """Seal ``frames`` for ``address`` and send them through its ``dealer`` (or keep
        them until its handshake ends)."""
        sealed = self._sessions.seal_out(address, list(frames))
        if sealed is not None:
            send_frames(dealer, sealed)
            if self._by_fd:
                self._unsure.add(dealer)  # (a send may take the command its ZMQ_FD signals)

    def _watch(self, watch: DisconnectWatch) -> DisconnectWatch:
        # The monitor polled by its ZMQ_FD (edge-triggered: sound as only closed() reads it,
        # always until empty), not as a socket zmq_poll asks EVENTS (2 syscalls) twice a wait.
        self._watches[watch.monitor], self._watch_fds[watch.fd] = watch, watch
        self._poller.register(watch.fd, zmq.POLLIN)
        return watch

    def through_lane(self, peer: Peer) -> bool:
        """Whether messages to and from ``peer`` take the local lane now. Never blocks."""
        if peer.startswith(b"i:"):
            return peer[2:] in self._lane_in
        return peer[2:].decode() in self._lane_out

    def recv(self, timeout_s: float | None) -> Envelope | None:
        if self._ready or self._fill(timeout_s):
            return self._ready.popleft()
        return None

    def recv_burst(self, timeout_s: float | None, limit: int) -> list[Envelope]:
        """As :meth:`Transport.recv_burst`: every message queued already, or read by one
        poll (up to :data:`~trimtab.transport.zmq_in.BURST` a ready socket, each checked
        as :meth:`recv`'s), up to ``limit``; no second poll behind it. Blocks as
        :meth:`recv`."""
        ready = self._ready
        if not ready and not self._fill(timeout_s):
            return []
        if len(ready) <= limit:
            burst = list(ready)
            ready.clear()
            return burst
        return [ready.popleft() for _ in range(limit)]

    def _fill(self, timeout_s: float | None) -> bool:
        """Poll and read until a message for the node is queued (True), or a wake, a
        lane closing or ``timeout_s`` ends the wait (False). Blocks up to ``timeout_s``."""
        # (max(0, ...) as a conditional: two calls a wait fewer, a wait a message)
        if timeout_s is None:
            timeout_ms = deadline = None
        else:
            if timeout_s < 0:
                timeout_s = 0.0
            timeout_ms = int(timeout_s * 1000)
            deadline = time.monotonic() + timeout_s
        gone = len(self._gone)
        while True:
            wait_ms = timeout_ms
            if self._unsure:  # (before any wait: their descriptors may stay quiet)
                self._in.settle()
                if self._ready:
                    return True
                if self._unsure:  # a burst read, nothing in it for the node: read on
                    wait_ms = 0
            if self.spin_s > 0:
                events = poll_spinning(self._poller, wait_ms, self.spin_s, self.spins)
            else:  # (poll_spinning's wait without a spin, inlined: a call a turn)
                events = dict(_POLL(self._poller.sockets, -1 if wait_ms is None else wait_ms))
            woken = self._wake_r in events
            if woken:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            self._take(events)
            if self._ready:
                return True
            # Only what was handled, nothing for the node (a handshake's step, an
            # accepted connection, a message dropped): wait on, unless woken or late.
            woken = woken or len(self._gone) > gone  # a lane closed: the node wants to know
            if woken or (deadline is not None and time.monotonic() >= deadline):
                return False
            if deadline is not None:
                timeout_ms = max(1, math.ceil((deadline - time.monotonic()) * 1000))

    def _take(self, events: dict[Any, int]) -> None:
        """Read what ``events`` say is there: lane connections, new ones, ZeroMQ
        sockets (:mod:`~trimtab.transport.zmq_in`: each message checked, opened and
        queued, or answered or dropped)."""
        for sock, flags in events.items():
            if isinstance(sock, zmq.Socket):
                if sock is self._router:
                    read_router(sock, self._sessions, self._ready, self._router_watch)
                else:  # (a DEALER polled as a socket: not dealers_by_fd)
                    self._in.read(sock)
                continue
            dealer = self._dealer_fd.get(sock)
            if dealer is not None:
                self._in.read(dealer)
                continue
            watch = self._watch_fds.get(sock)
            if watch is not None:  # a connection closed (or its monitor chatted)
                self._gone.extend(watch.closed())
            else:
                self._lanes.on_ready(sock, flags)

    @property
    def refused(self) -> int:
        """Messages and connections refused so far: unauthenticated, forged, replayed,
        or over the limits (ZAP's refusals included). Never blocks."""
        zap = self._shared.zap
        return self._sessions.refused + (zap.refused if zap is not None else 0)

    def recv_queued(self) -> Envelope | None:
        return self._ready.popleft() if self._ready else None

    def lost(self) -> list[Peer]:
        """As :meth:`Transport.lost`: peers whose local lane closed (seen at once)."""
        gone = list(self._gone)
        self._gone.clear()
        return gone

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full pipe: already woken; closed: nothing to wake
            os.write(self._wake_w, b"w")

    def companion(self) -> ZmqTransport:
        return ZmqTransport(
            bind=False,
            reuse_buffers=False,
            lane=self._lane,
            limits=self._limits,
            _shared=self._shared,
        )

    def close(self, linger_s: float = _LINGER_S) -> None:
        """Close every socket, giving queued messages up to ``linger_s`` to leave (0:
        drop them, e.g. a request whose peer did not answer). Blocks that long at most."""
        if self._closed:
            return
        deadline = time.monotonic() + linger_s  # one grace period for all, as ZeroMQ's
        # Peers whose lane broke (their process ended) and that no handshake reached
        # since, and those a ZeroMQ connection never reached (nobody listens: a process
        # that ended, or never began): what waits for them cannot leave, so it is dropped,
        # not lingered over.
        for watch in self._dealer_watch.values():
            self._gone.extend(watch.closed())  # (its last events: did it connect?)
        gone = {
            a for a in self._lost if a not in self._lane_out and not self._sessions.established(a)
        } | {
            a
            for a, w in self._dealer_watch.items()
            if not w.connected and time.monotonic() - w.since > _CONNECT_S
        }
        # Messages that wait for a handshake leave only as our recv finishes it.
        while time.monotonic() < deadline and (
            self._sessions.waiting_besides(gone) or self._lanes.waiting
        ):
            self.recv(0.02)
        self._closed = True
        self._lanes.close(deadline)
        for watch in self._watches.values():
            watch.close()
        for address, dealer in self._dealers.items():
            dealer.close(linger=0 if address in gone else int(linger_s * 1000))
        if self._router is not None:
            self._router.close(linger=int(linger_s * 1000))
        self._dealers.clear()
        self._dealer_watch.clear()
        self._dealer_fd.clear()
        self._unsure.clear()
        self._router = None
        self._shared.release()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
