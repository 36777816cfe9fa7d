"""Asking a running job's coordinator something from outside the job.

For tools that are not members of the job (the launcher polling for servers to start,
``trimtab scale``): one request, one reply, over a ZeroMQ socket of their own.
"""

from __future__ import annotations

import zmq

from trimtab.errors import NodeTimeout, ProtocolError
from trimtab.protocol.messages import Control, Header, WireHeader, decode, encode, read_error


def ask_coordinator(address: str, job: str, header: WireHeader, timeout_s: float) -> Header:
    """Send one control request (a builder's header, e.g. ``headers.status_request()``)
    to a running job's coordinator and return the reply, decoded: read it with its
    reader (``headers.read_status_reply``).

    Blocks up to ``timeout_s``; raises :class:`NodeTimeout` if no reply came, and
    :class:`ProtocolError` if the coordinator answered an error. Thread-safe (each call
    has its own socket).
    """
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(encode({**header, "i": 1, "j": job}))
        if not sock.poll(int(timeout_s * 1000)):
            raise NodeTimeout(f"the coordinator at {address} did not answer in {timeout_s:g}s")
        reply = decode(sock.recv(), job)
    finally:
        sock.close()
    if reply["o"] == Control.ERROR:
        raise ProtocolError(f"the coordinator refused: {read_error(reply)['msg']}")
    return reply
