"""Asking a running job's coordinator something from outside the job.

For tools that are not members of the job (the launcher polling for servers to start,
``trimtab scale``): one request, one reply, over a transport of their own, which proves
the job's secret as every member's does.
"""

from __future__ import annotations

import functools
import time

from trimtab.errors import NodeTimeout, ProtocolError
from trimtab.launch.testbed import Host
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, Header, WireHeader, decode, encode, read_error
from trimtab.transport.auth import JobKey
from trimtab.transport.zmq import ZmqTransport


def ask_coordinator(
    address: str, job: str, header: WireHeader, timeout_s: float, auth: JobKey | None
) -> Header:
    """Send one control request (a builder's header, e.g. ``headers.status_request()``)
    to a running job's coordinator and return the reply, decoded: read it with its
    reader (``headers.read_status_reply``).

    ``auth`` is the job's key (``None`` only for a job run without one). Blocks up to
    ``timeout_s``; raises :class:`NodeTimeout` if no reply came (a coordinator refuses a
    tool without the job's secret by silence), and :class:`ProtocolError` if the
    coordinator answered an error. Thread-safe (each call has its own transport).
    """
    transport = ZmqTransport(bind=False, reuse_buffers=False, auth=auth)
    answered = False
    try:
        peer = transport.connect(address)
        transport.send(peer, [encode({**header, "i": 1, "j": job})])
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            got = transport.recv(left)
            if got is not None and got.peer == peer:
                break
        else:
            raise NodeTimeout(
                f"the coordinator at {address} did not answer in {timeout_s:g}s (is the "
                "job running, and is this its secret file?)"
            )
        answered = True
        reply = decode(got.frames[0], job)
    finally:
        # Unanswered (the coordinator is gone or refused us): nothing queued is worth
        # waiting for, as a launcher polling a job that just ended would.
        if answered:
            transport.close()
        else:
            transport.close(linger_s=0.0)
    if reply["o"] == Control.ERROR:
        raise ProtocolError(f"the coordinator refused: {read_error(reply)['msg']}")
    return reply


def job_status(address: str, job: str, auth: JobKey | None, host: Host | None) -> Header | None:
    """The coordinator's STATUS reply (read it with ``headers.read_status_reply``), or
    None if it did not answer within 2 s. ``host``: the bed host the coordinator runs
    on, asked from inside it (the machine's own namespace cannot reach a bed). Blocks;
    raises :class:`ProtocolError` if the coordinator answered an error."""
    ask = functools.partial(ask_coordinator, address, job, headers.status_request(), 2.0, auth)
    try:
        return ask() if host is None else host.call(ask)
    except NodeTimeout:
        return None
