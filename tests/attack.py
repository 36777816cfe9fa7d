"""An attacker on the same machine, for tests: a process that knows a job's addresses
and id (``ps`` and ``ss`` show them) but not its secret; and, for tests of bad input
from a member, a raw client that holds the secret.

Every helper is bounded in time; none raises for what the node does (closing, not
answering): they return what happened, for the test to assert on.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Sequence
from pathlib import Path

import msgpack
import zmq

from trimtab.transport.auth import JobKey, read_secret_file
from trimtab.transport.lane import lane_name
from trimtab.transport.zmq import ZmqTransport

#: The local lane's framing claims that once killed a node (``<I`` count, ``<Q`` lengths).
CLAIM_2_50 = struct.pack("<IQ", 1, 1 << 50)  # 12 bytes: one frame of 2^50 bytes
CLAIM_1024_X_64M = struct.pack("<I1024Q", 1024, *([64 << 20] * 1024))
CLAIM_512M = struct.pack("<IQ", 1, 512 << 20)  # then never sent


def lane_send(address: str, data: bytes, hold_s: float = 1.0) -> bool:
    """Connect to the local lane of ``address`` (a ``tcp://`` address), send ``data``
    raw, and wait up to ``hold_s``; return whether the node closed the connection."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(lane_name(address))
        sock.sendall(data)
        sock.settimeout(hold_s)
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            try:
                if sock.recv(4096) == b"":
                    return True
            except TimeoutError:
                return False
            except OSError:
                return True
        return False
    finally:
        sock.close()


def outsider_request(address: str, frames: Sequence[bytes], timeout_s: float = 2.0) -> bool:
    """Send ``frames`` over ZeroMQ TCP without credentials, as a tool without the secret
    would; return whether any reply came (it must not)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    try:
        sock.connect(address)
        try:
            sock.send_multipart(list(frames))
        except zmq.Again:
            return False
        return bool(sock.poll(int(timeout_s * 1000)))
    finally:
        sock.close()


def raw_tcp(address: str, data: bytes, timeout_s: float = 5.0) -> None:
    """Write ``data`` to the TCP port of ``address`` (not speaking ZeroMQ's handshake),
    as much as the node takes within ``timeout_s``."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    with sock, contextlib.suppress(OSError):  # the node closed it: what we want
        sock.sendall(data)


def rss_bytes(pid: int) -> int:
    """A process's resident memory, in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for {pid}")


def job_id_of(pid: int) -> str:
    """The job id a role's command line shows (``--job ID``), as ``ps`` shows anyone."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(b"--job") + 1].decode()


class Member:
    """A raw client holding the job's secret: sends any frames, authenticated, and
    returns the reply's header (for tests of malformed input from a member)."""

    def __init__(self, secret_file: str | Path, *, lane: bool = False) -> None:
        self.key = JobKey(read_secret_file(secret_file))
        self.lane = lane

    def request(self, address: str, frames: Sequence[bytes], timeout_s: float = 10.0) -> dict:
        transport = ZmqTransport(bind=False, reuse_buffers=False, lane=self.lane, auth=self.key)
        try:
            peer = transport.connect(address)
            transport.send(peer, list(frames))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                got = transport.recv(0.1)
                if got is not None:
                    reply = msgpack.unpackb(got.frames[0])
                    assert isinstance(reply, dict)
                    return reply
            raise AssertionError("no reply to a member's bad message: the node must answer")
        finally:
            transport.close()
