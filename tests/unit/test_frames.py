"""One ZeroMQ message, sent and received frame by frame (:mod:`trimtab.transport.frames`),
over a real TCP connection on loopback: what ``send_multipart``/``recv_multipart`` would
deliver, frames in order, one message not run into the next."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from trimtab.transport.frames import (
    EVENTS,
    POLLIN,
    recv_buffers,
    recv_frames,
    recv_routed,
    send_frames,
)


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()


@pytest.mark.timeout(30)
def test_messages_arrive_whole_and_in_order(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    a, b = pair
    big = memoryview(bytearray(range(256)) * 1024)  # over pyzmq's copy threshold: zero-copy
    send_frames(b, [b"head", big, b"tail"])
    send_frames(b, [b"alone"])
    assert a.poll(10_000)
    first = recv_frames(a)
    assert [f.bytes for f in first] == [b"head", big.tobytes(), b"tail"]
    assert a.poll(10_000)  # (the second message may trail the first off the wire)
    assert [f.bytes for f in recv_frames(a)] == [b"alone"]
    assert not a.getsockopt(EVENTS) & POLLIN
    with pytest.raises(zmq.Again):
        recv_frames(a)


@pytest.mark.timeout(30)
def test_buffers_arrive_whole_in_order_and_outlive_their_frames(
    pair: tuple[zmq.Socket[bytes], ...],
) -> None:
    a, b = pair
    big = memoryview(bytearray(range(256)) * 1024)  # zero-copy: the buffer is the frame's
    send_frames(b, [b"head", big])
    send_frames(b, [b"alone"])
    assert a.poll(10_000)
    first = recv_buffers(a)
    assert a.poll(10_000)
    second = recv_buffers(a)
    # Nothing but the buffers holds the frames now: their bytes are still there.
    assert [bytes(x) for x in first] == [b"head", big.tobytes()]
    assert [bytes(x) for x in second] == [b"alone"]
    with pytest.raises(zmq.Again):
        recv_buffers(a)


@pytest.mark.timeout(30)
def test_a_routers_message_arrives_as_its_identity_buffers_and_last_frame() -> None:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.IDENTITY, b"dealer-1")
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        big = memoryview(bytearray(range(256)) * 1024)  # zero-copy: the frame's buffer
        send_frames(dealer, [b"head", big])
        send_frames(dealer, [b"alone"])
        assert router.poll(10_000)
        identity, buffers, last = recv_routed(router)
        assert identity == b"dealer-1"
        assert [bytes(x) for x in buffers] == [b"head", big.tobytes()]
        assert last.bytes == big.tobytes()  # (the frame a connection's descriptor is read off)
        assert router.poll(10_000)
        identity, buffers, last = recv_routed(router)
        assert (identity, [bytes(x) for x in buffers], last.bytes) == (
            b"dealer-1",
            [b"alone"],
            b"alone",
        )
        with pytest.raises(zmq.Again):
            recv_routed(router)
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()
