"""The local lane: Unix-domain stream sockets between processes of one machine.

A message through ZeroMQ wakes ZeroMQ's I/O thread in the sender and again in the
receiver; on a busy 2-core machine each wake-up cost more than the rest of a small push
(BENCHMARKS.md, small messages), and those threads took about as much CPU per message as
the Python that made it. On the lane the sending thread writes the message into the
kernel itself and the receiving thread, already blocked in its poll, reads it: no other
thread runs in between.

A transport that binds ``tcp://HOST:PORT`` also listens on the abstract Unix socket
:func:`lane_name` of that address (Linux; abstract names vanish with the process, so
nothing is left in the file system), and a transport asked to connect to a loopback
address tries that socket first, falling back to ZeroMQ when nobody listens there.
``TRIMTAB_SHM=0`` turns the lane off along with shared memory (every byte then goes
through TCP, as between machines).

Wire format of a message: ``<I`` frame count, ``<Q`` length per frame, then the frames'
bytes, back to back. With the job's secret, a connection first runs the handshake of
:mod:`trimtab.transport.auth` (fixed-size messages, unframed: nothing else is parsed
until the peer has proven the secret; anything else closes the connection). Its messages
then carry no MAC, unlike ZeroMQ's: a connected Unix stream socket has exactly two ends,
both proven, and the kernel delivers its bytes in order, once, from the other end only,
so nothing can be injected, replayed, reordered or redirected into it (a process that
could take one of its descriptors runs as the job's user, who is the job anyway). The
MAC cost a fifth of a 1 KiB round trip. The length prefix is checked against the
:class:`~trimtab.transport.limits.Limits` before a byte is allocated for the body.

Sockets are non-blocking: a message the kernel cannot take at once
is queued and written when the socket is writable again (the owner's poll asks for it),
so two processes that both send a lot never block each other.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import socket
import struct
import sys
from collections.abc import Mapping, Sequence

from trimtab.transport.auth import (
    CHALLENGE_BYTES,
    HELLO_BYTES,
    PROOF_BYTES,
    AuthRefused,
    ClientHandshake,
    ServerHandshake,
)
from trimtab.transport.base import Frame, Peer
from trimtab.transport.limits import Limits
from trimtab.transport.shm import ENV as SHM_ENV

log = logging.getLogger("trimtab.transport")

_COUNT = struct.Struct("<I")
#: A message with more bytes than this is received straight into a buffer of its own
#: rather than through the read buffer (one copy fewer for big frames).
_DIRECT = 1 << 20
#: Bytes read per ``recv_into`` call.
_READ = 1 << 18
#: Buffers per ``sendmsg`` call when flushing a queue (below any IOV_MAX).
_IOV = 64
#: Kernel buffer sizes asked for: room for many headers and small messages in flight.
_SOCKBUF = 1 << 20


#: Set to ``0`` to send local messages through ZeroMQ too (shared memory stays on).
LANE_ENV = "TRIMTAB_LANE"


def lane_from_env(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` lets transports use the local lane: yes unless
    ``TRIMTAB_LANE=0``, or ``TRIMTAB_SHM=0`` (everything through TCP, as between
    machines). For the edges that read the environment (the CLI, the launcher,
    ``trimtab.init()``) to pass as ``ZmqTransport(lane=...)``. Never blocks or raises."""
    return environ.get(LANE_ENV, "1") != "0" and environ.get(SHM_ENV, "1") != "0"


def supported() -> bool:
    """Whether this platform has abstract Unix-domain sockets (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


def lane_name(address: str) -> bytes:
    """The abstract socket name of the lane of a ``tcp://HOST:PORT`` address."""
    return b"\0trimtab-lane:" + address.encode()


class LaneClosed(Exception):
    """The connection ended or broke (the peer exited, or sent something malformed)."""


class LaneRefused(LaneClosed):
    """The peer failed the handshake, or sent a message over the limits or without a
    valid MAC: the connection is closed."""


def _byte_view(frame: Frame) -> memoryview:
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class LaneConnection:
    """One end of a lane: framing over a non-blocking Unix stream socket.

    Not thread-safe: its transport's owning thread uses it. ``send`` and ``flush`` never
    block; ``read`` returns what has fully arrived.
    """

    def __init__(
        self,
        sock: socket.socket,
        peer: Peer,
        limits: Limits,
        handshake: ClientHandshake | ServerHandshake | None = None,
    ) -> None:
        sock.setblocking(False)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):  # the kernel's default is fine, only smaller
                sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKBUF)
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self._limits = limits
        self._out: collections.deque[memoryview] = collections.deque()
        self._in = bytearray()
        self._body: bytearray | None = None  # a big message being received in place
        self._filled = 0
        self._lengths: tuple[int, ...] = ()
        # The handshake under way (None: done, or no authentication), what of its
        # current message has arrived, and the messages sent meanwhile.
        self._handshake = handshake
        self._partial = bytearray()
        self._waiting: list[list[Frame]] = []
        if isinstance(handshake, ClientHandshake):
            self._write([memoryview(handshake.hello)])

    @property
    def queued(self) -> bool:
        """Whether bytes wait for the socket to take them. Never blocks."""
        return bool(self._out)

    @property
    def waiting(self) -> bool:
        """Whether messages wait for the handshake to finish. Never blocks."""
        return bool(self._waiting)

    @property
    def proven(self) -> bool:
        """Whether the handshake is done (or there is none). Never blocks."""
        return self._handshake is None

    def send(self, frames: Sequence[Frame]) -> bool:
        """Write one message, queueing what the kernel did not take (or all of it, until
        the handshake is done); return whether bytes are queued. The frames' memory must
        stay unchanged until sent (the transport contract asks that anyway). Never
        blocks; raises :class:`LaneClosed`."""
        if self._handshake is not None:
            self._waiting.append(list(frames))
            return bool(self._out)
        views = [_byte_view(f) for f in frames]
        prefix = struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views))
        return self._write([memoryview(prefix), *views])

    def _write(self, bufs: list[memoryview]) -> bool:
        if self._out:
            self._out.extend(v for v in bufs if v.nbytes)
            return self.flush()
        try:
            sent = self.sock.sendmsg(bufs, (), socket.MSG_NOSIGNAL)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise LaneClosed(str(exc)) from exc
        for buf in bufs:
            if sent >= buf.nbytes:
                sent -= buf.nbytes
                continue
            self._out.append(buf[sent:] if sent else buf)
            sent = 0
        return bool(self._out)

    def _shake(self) -> bool | None:
        """Advance the handshake with what the socket holds: True once done, False if
        more must arrive, None if the peer closed. Reads no byte past the handshake's
        fixed-size messages. Never blocks; raises :class:`LaneRefused`."""
        while (hs := self._handshake) is not None:
            if isinstance(hs, ClientHandshake):
                need = CHALLENGE_BYTES
            else:
                need = PROOF_BYTES if hs.hello_seen else HELLO_BYTES
            try:
                got = self.sock.recv(need - len(self._partial))
            except BlockingIOError:
                return False
            except OSError:
                return None
            if not got:
                return None
            self._partial += got
            if not hs_prefix_ok(hs, self._partial):  # refused at its first bytes
                raise LaneRefused("a connection began with something other than the handshake")
            if len(self._partial) < need:
                continue
            message = bytes(self._partial)
            self._partial.clear()
            try:
                # Each side checks the other's proof; the session keys it derives are
                # not needed here (see the module's docstring).
                if isinstance(hs, ClientHandshake):
                    proof, _ = hs.on_challenge(message)
                    self._handshake = None
                    self._write([memoryview(proof)])
                elif not hs.hello_seen:
                    self._write([memoryview(hs.on_hello(message))])
                else:
                    hs.on_proof(message)
                    self._handshake = None
            except AuthRefused as exc:
                raise LaneRefused(str(exc)) from None
        waiting, self._waiting = self._waiting, []
        for frames in waiting:
            self.send(frames)
        return True

    def flush(self) -> bool:
        """Write queued bytes until the kernel takes no more; return whether any are
        still queued. Never blocks; raises :class:`LaneClosed`."""
        out = self._out
        while out:
            try:
                sent = self.sock.sendmsg(list(itertools.islice(out, _IOV)), (), socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return True
            except OSError as exc:
                raise LaneClosed(str(exc)) from exc
            while out and out[0].nbytes <= sent:
                sent -= out.popleft().nbytes
            if sent:
                out[0] = out[0][sent:]
        return False

    def read(self, scratch: memoryview) -> tuple[list[list[memoryview]], bool]:
        """Read what the socket holds; return the messages completed (their frames are
        writable views of buffers of their own) and whether the peer has closed. Never
        blocks. Raises :class:`LaneClosed` for a malformed message."""
        messages: list[list[memoryview]] = []
        if self._handshake is not None:
            done = self._shake()
            if done is None:
                return messages, True
            if not done:
                return messages, False
        while True:
            big = self._body
            target = scratch if big is None else memoryview(big)[self._filled :]
            try:
                n = self.sock.recv_into(target)
            except BlockingIOError:
                return messages, False
            except OSError:
                return messages, True
            if n == 0:
                return messages, True
            if big is not None:  # a big message, received in place
                self._filled += n
                if self._filled == len(big):
                    messages.append(_split(big, self._lengths))
                    self._body = None
                continue
            self._in += scratch[:n]
            self._parse(messages)
            if n < len(scratch) and self._body is None:
                # The socket was drained (a stream hands over all it holds, up to the
                # buffer): asking again would only raise BlockingIOError. What arrives
                # meanwhile makes the next poll return.
                return messages, False

    def _parse(self, messages: list[list[memoryview]]) -> None:
        buf = self._in
        pos = 0
        while len(buf) - pos >= _COUNT.size:
            (count,) = _COUNT.unpack_from(buf, pos)
            if not 0 < count <= self._limits.max_frames:
                raise LaneRefused(
                    f"a message of {count} frames (at most {self._limits.max_frames})"
                )
            head = _COUNT.size + 8 * count
            if len(buf) - pos < head:
                break
            lengths = struct.unpack_from(f"<{count}Q", buf, pos + _COUNT.size)
            why = self._limits.check_lengths(lengths)
            if why:  # before a byte of it is allocated
                raise LaneRefused(why)
            total = sum(lengths)
            start = pos + head
            have = len(buf) - start
            if have >= total:
                messages.append(_split(buf[start : start + total], lengths))
                pos = start + total
                continue
            if total > _DIRECT:
                self._body = bytearray(total)
                self._body[:have] = buf[start:]
                self._filled = have
                self._lengths = lengths
                pos = len(buf)
            break
        del buf[:pos]

    def close(self, *, linger_s: float = 0.0) -> None:
        """Close the socket, first trying up to ``linger_s`` to write what is queued.
        Blocks up to ``linger_s``; never raises."""
        if self._out and linger_s > 0:
            try:
                self.sock.settimeout(linger_s)
                while self._out:
                    self.sock.sendall(self._out.popleft())
            except OSError:
                pass
        self._out.clear()
        self.sock.close()


def hs_prefix_ok(hs: ClientHandshake | ServerHandshake, partial: bytearray) -> bool:
    """Whether ``partial`` can still become the handshake message ``hs`` waits for."""
    magic = hs.expected_magic
    n = min(len(partial), len(magic))
    return partial[:n] == magic[:n]


def _split(body: bytearray, lengths: Sequence[int]) -> list[memoryview]:
    view = memoryview(body)
    frames = []
    at = 0
    for length in lengths:
        frames.append(view[at : at + length])
        at += length
    return frames
