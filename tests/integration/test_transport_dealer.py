"""A DEALER polled by its ZMQ_FD misses no message (:mod:`trimtab.transport.zmq`).

That descriptor signals a message only when the socket was found empty since it last
took a command; a send on the socket may take the command that says a message came,
leaving the message readable and the descriptor quiet. These tests put a message in
that state on purpose: a transport that waited on the descriptor without looking at the
socket's EVENTS first would wait out the whole timeout and return nothing (as a server
would wait for the coordinator's message after a heartbeat it sent).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from trimtab.transport import Envelope, Peer, ZmqTransport
from trimtab.transport.auth import JobKey
from trimtab.transport.zmq_in import BURST

#: The longest any receive here waits: a message missed shows as None after it.
_WAIT_S = 5.0
#: Long enough for a message to reach the other side's socket on a loaded machine, and
#: past libzmq's throttle of a send's command processing (about 1 ms).
_ARRIVE_S = 0.05


def _recv(t: ZmqTransport, timeout_s: float = _WAIT_S) -> Envelope | None:
    """One message off ``t`` within ``timeout_s`` (None if none came)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        env = t.recv(left)
        if env is not None:
            return env
    return None


@pytest.fixture(
    params=[(False, True), (True, True), (True, False)],
    ids=["server-no-key", "server-key", "worker-key"],
)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[ZmqTransport, ZmqTransport, Peer, Peer]]:
    """A bound transport (the coordinator's side) and one connected to it by a DEALER,
    over ZeroMQ TCP, with the job's key or without: ``(bound, connected, the bound one
    as the connected one names it, and the reverse)``. The connected one binds too, as
    a server's transport does (its DEALERs polled by their ZMQ_FD), or not, as a
    worker's (polled as sockets)."""
    keyed, binds = request.param
    key = JobKey(os.urandom(32)) if keyed else None
    bound = ZmqTransport(bind=True, lane=False, auth=key)
    connected = ZmqTransport(bind=binds, lane=False, auth=key)
    try:
        to_bound = connected.connect(bound.address)
        connected.send(to_bound, [b"hello"])
        env = None
        while env is None:  # (the connected side's recv finishes its handshake)
            env = bound.recv(0.01)
            connected.recv(0.01)
        assert bytes(env.frames[0]) == b"hello"
        yield bound, connected, to_bound, env.peer
    finally:
        connected.close(0)
        bound.close(0)


@pytest.mark.parametrize("via", ["send", "send_to"])
def test_a_message_that_came_before_a_send_on_the_dealer_is_received_at_once(
    pair: tuple[ZmqTransport, ZmqTransport, Peer, Peer], via: str
) -> None:
    bound, connected, to_bound, to_connected = pair
    for i in range(5):
        bound.send(to_connected, [b"news %d" % i])
        time.sleep(_ARRIVE_S)  # it is in the DEALER's queue, its descriptor signalled
        # The send takes the socket's commands, the one for that message among them.
        if via == "send":
            connected.send(to_bound, [b"heartbeat"])
        else:
            connected.send_to(bound.address, [b"heartbeat"])
        env = _recv(connected)
        assert env is not None, "a message readable on the DEALER was not received"
        assert bytes(env.frames[0]) == b"news %d" % i
        assert env.peer == to_bound


def test_more_than_a_burst_queued_at_once_is_all_received(
    pair: tuple[ZmqTransport, ZmqTransport, Peer, Peer],
) -> None:
    bound, connected, _, to_connected = pair
    n = 3 * BURST + 5
    for i in range(n):
        bound.send(to_connected, [i.to_bytes(4, "big")])
    time.sleep(0.2)  # all of them queued at the DEALER: its descriptor signals once
    got = []
    for _ in range(n):
        env = _recv(connected)
        assert env is not None, f"{len(got)} of {n} received, then nothing"
        got.append(int.from_bytes(bytes(env.frames[0]), "big"))
    assert got == list(range(n))


def test_a_message_that_comes_while_the_dealer_waits_wakes_it(
    pair: tuple[ZmqTransport, ZmqTransport, Peer, Peer],
) -> None:
    bound, connected, to_bound, to_connected = pair
    connected.send(to_bound, [b"heartbeat"])  # (unsure: the wait looks at it first)
    later = threading.Timer(0.2, bound.send, (to_connected, [b"late"]))
    later.start()
    try:
        env = _recv(connected)
    finally:
        later.join()
    assert env is not None and bytes(env.frames[0]) == b"late"
