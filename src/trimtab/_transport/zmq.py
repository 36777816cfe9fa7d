"""The real transport: ZeroMQ over TCP.

A node that serves binds one ROUTER socket; every connection it opens is a DEALER.
Tensor frames are sent with ``copy=False`` (pyzmq copies only frames below its
``copy_threshold``) and received as ``zmq.Frame`` objects exposed as memoryviews, so
the bytes are not copied again in Python.

A pipe wakes the poller, so other threads can hand the I/O thread work without a
socket of their own (ZeroMQ sockets must stay on one thread).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Sequence

import zmq

from trimtab._transport.base import Envelope, Frame, Peer, Transport, in_peer, out_peer

#: How many messages one ready socket may yield per poll before others get a turn.
_BURST = 64

# glibc's mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_kept_freed_memory = False


def keep_freed_memory() -> bool:
    """Make this process's allocator reuse the memory of freed receive buffers.

    ZeroMQ allocates a fresh buffer for every large frame it receives and frees it when
    the frame is dropped. With glibc's defaults, buffers of a few MiB are mapped and
    unmapped (or trimmed off the heap) each time, so every received byte first costs a
    page fault: 15.6k faults a step per worker in ``trimtab bench datapath``, a third of
    the ZeroMQ I/O thread's CPU (BENCHMARKS.md). Keeping freed memory on the heap lets
    the next frame land in pages already mapped. The price: the process keeps its peak
    of in-flight frames mapped (about one model's worth for a worker). Process-wide and
    idempotent; returns whether it applied (glibc only). Never raises.
    """
    global _kept_freed_memory
    if _kept_freed_memory:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = (
        mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # frames up to 32 MiB come from the heap
        and mallopt(_M_TRIM_THRESHOLD, 1 << 30)  # and freed ones stay there
        and mallopt(_M_TOP_PAD, 64 << 20)  # grow heaps in large steps
    )
    _kept_freed_memory = bool(ok)
    return _kept_freed_memory


class _SharedContext:
    """A ZeroMQ context shared by a transport and its companions: one ZeroMQ I/O thread
    per process, terminated when the last of them closes. Thread-safe."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self._users = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.ctx.term()  # every socket is closed by now, so this does not block


class ZmqTransport(Transport):
    """A :class:`Transport` over ZeroMQ TCP sockets.

    Args:
        bind: bind a ROUTER socket so peers can connect to this node.
        host: the interface to bind; loopback by default.
        port: the port to bind; 0 picks a free one.
        max_frame_bytes: an inbound frame over this closes that peer's connection
            (ZeroMQ's MAXMSGSIZE), so a runaway sender cannot exhaust memory; ``None``
            for no limit.
        reuse_buffers: tune the process's allocator so received frames reuse freed
            memory (:func:`keep_freed_memory`).
    """

    def __init__(
        self,
        *,
        bind: bool,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int | None = None,
        reuse_buffers: bool = True,
        _shared: _SharedContext | None = None,
    ) -> None:
        if reuse_buffers:
            keep_freed_memory()
        self._shared = _shared or _SharedContext()
        self._shared.acquire()
        self._closed = False
        self._ctx = self._shared.ctx
        self._poller = zmq.Poller()
        self._dealers: dict[str, zmq.Socket[bytes]] = {}
        self._dealer_peer: dict[zmq.Socket[bytes], Peer] = {}
        self._ready: collections.deque[Envelope] = collections.deque()
        self._max_frame = max_frame_bytes
        self._address = ""
        self._router: zmq.Socket[bytes] | None = None
        if bind:
            router = self._ctx.socket(zmq.ROUTER)
            self._tune(router)
            if max_frame_bytes is not None:
                router.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
            if port == 0:
                port = router.bind_to_random_port(f"tcp://{host}")
            else:
                router.bind(f"tcp://{host}:{port}")
            self._address = f"tcp://{host}:{port}"
            self._router = router
            self._poller.register(router, zmq.POLLIN)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller.register(self._wake_r, zmq.POLLIN)

    @staticmethod
    def _tune(sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.LINGER, 2000)
        # Bounded queues keep memory in check; the defaults (1000 messages) are fine for
        # chunked tensors of a few MiB each.
        sock.setsockopt(zmq.SNDHWM, 10000)
        sock.setsockopt(zmq.RCVHWM, 10000)

    @property
    def address(self) -> str:
        return self._address

    def connect(self, address: str) -> Peer:
        if address not in self._dealers:
            dealer = self._ctx.socket(zmq.DEALER)
            self._tune(dealer)
            if self._max_frame is not None:
                dealer.setsockopt(zmq.MAXMSGSIZE, self._max_frame)
            dealer.connect(address)
            self._dealers[address] = dealer
            self._dealer_peer[dealer] = out_peer(address)
            self._poller.register(dealer, zmq.POLLIN)
        return out_peer(address)

    def send(self, peer: Peer, frames: Sequence[Frame]) -> None:
        if peer.startswith(b"i:"):
            if self._router is None:
                raise KeyError(peer)
            self._router.send_multipart([peer[2:], *frames], copy=False)
        else:
            self._dealers[peer[2:].decode()].send_multipart(frames, copy=False)

    def recv(self, timeout_s: float | None) -> Envelope | None:
        if self._ready:
            return self._ready.popleft()
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        events = dict(self._poller.poll(timeout_ms))
        if self._wake_r in events:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        for sock in events:
            if not isinstance(sock, zmq.Socket):
                continue
            for _ in range(_BURST):
                try:
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if sock is self._router:
                    self._ready.append(
                        Envelope(in_peer(parts[0].bytes), [p.buffer for p in parts[1:]])
                    )
                else:
                    self._ready.append(Envelope(self._dealer_peer[sock], [p.buffer for p in parts]))
                # Asking is cheaper than the exception a receive on an empty socket raises.
                if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    break
        return self._ready.popleft() if self._ready else None

    def recv_queued(self) -> Envelope | None:
        return self._ready.popleft() if self._ready else None

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full pipe: already woken; closed: nothing to wake
            os.write(self._wake_w, b"w")

    def companion(self) -> ZmqTransport:
        return ZmqTransport(
            bind=False, max_frame_bytes=self._max_frame, reuse_buffers=False, _shared=self._shared
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in [*self._dealers.values(), *([self._router] if self._router else [])]:
            sock.close()
        self._dealers.clear()
        self._router = None
        self._shared.release()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
