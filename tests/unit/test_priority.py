"""The server's priority: pushes queued together are merged first layers first."""

from __future__ import annotations

import uuid

from trimtab import Server, ServerConfig
from trimtab.protocol.messages import Data, decode, encode
from trimtab.roles.server.lifecycle import ServerState
from trimtab.roles.server.priority import by_priority
from trimtab.transport import Envelope, Fabric


def _queued_order(priority: bool) -> list[tuple[int, int | None]]:
    """Queue pushes for chunks 5, 3, 4, a STATS, then 2, 0, 1 at an idle server; return
    (op, chunk) in the order the server would handle them."""
    fabric = Fabric()
    job = uuid.uuid4().hex[:8]
    coordinator = fabric.transport(bind=True)
    server = Server(
        ServerConfig(coordinator=coordinator.address, job=job, priority=priority),
        fabric.transport(bind=True),
    )
    worker = fabric.transport(bind=False)
    to = worker.connect(server.address)
    for i, chunk in enumerate([5, 3, 4, None, 2, 0, 1]):
        if chunk is None:
            header = {"o": int(Data.STATS), "i": i, "j": job}
        else:
            header = {"o": int(Data.PUSH), "i": i, "j": job, "c": chunk, "e": 1, "k": 0}
        worker.send(to, [encode(header)])
    burst = server._transport.recv_burst(1.0, server._window)
    assert burst
    order = []
    for _, frames, _ in server._batch(burst):
        header = decode(frames[0], job)
        order.append((header["o"], header.get("c")))
    return order


def test_queued_pushes_go_lowest_chunk_first_without_crossing_other_messages() -> None:
    push, stats = int(Data.PUSH), int(Data.STATS)
    assert _queued_order(priority=True) == [
        (push, 3),
        (push, 4),
        (push, 5),
        (stats, None),
        (push, 0),
        (push, 1),
        (push, 2),
    ]


def test_without_priority_the_arrival_order_is_kept() -> None:
    # Only the first message is taken; the next loop turn takes the next, in order.
    assert _queued_order(priority=False) == [(int(Data.PUSH), 5)]


def test_the_order_is_a_pure_function_of_the_batch() -> None:
    """Neither the coordinator's messages nor undecodable ones are read as pushes; each
    keeps its place and splits the runs of pushes around it."""
    job, coordinator, worker = "j", b"o:coordinator", b"i:worker"

    def push(chunk: int) -> Envelope:
        header = {"o": int(Data.PUSH), "i": chunk, "j": job, "c": chunk}
        return Envelope(worker, [memoryview(encode(header))])

    from_coordinator = Envelope(coordinator, push(9).frames)  # a push's header, yet not one
    garbage = Envelope(worker, [memoryview(b"\xc1not msgpack")])
    batch = [push(2), push(1), from_coordinator, push(8), push(7), garbage, push(4), push(3)]
    order = by_priority(batch, coordinator, job)
    assert [f[0].obj for _, f, _ in order] == [
        e.frames[0].obj
        for e in [push(1), push(2), from_coordinator, push(7), push(8), garbage, push(3), push(4)]
    ]
    assert [h is None for _, _, h in order] == [False, False, True, False, False, True] + [
        False
    ] * 2
    assert by_priority([push(5)], coordinator, job) == [(worker, push(5).frames, None)]


def test_a_burst_with_bad_messages_is_credited_ordered_and_only_they_are_refused() -> None:
    """One burst off the transport: a CREDIT is consumed, each push that asks for it is
    credited at once, the pushes around the bad messages (not msgpack; another job's)
    are ordered in their runs, the bad ones keep their places, undecoded, and serving
    them answers ERROR to their sender only."""
    fabric = Fabric()
    job = uuid.uuid4().hex[:8]
    coordinator = fabric.transport(bind=True)
    server = Server(
        ServerConfig(coordinator=coordinator.address, job=job, priority=True),
        fabric.transport(bind=True),
    )
    good, bad = fabric.transport(bind=False), fabric.transport(bind=False)

    def push(rid: int, chunk: int) -> list[bytes]:
        header = {"o": int(Data.PUSH), "i": rid, "j": job, "c": chunk, "e": 1, "k": 0}
        return [encode({**header, "ak": True})]

    to, bad_to = good.connect(server.address), bad.connect(server.address)
    good.send(to, push(1, 5))
    bad.send(bad_to, [b"\xc1not msgpack"])
    good.send(to, push(2, 3))
    good.send(to, [encode({"o": int(Data.CREDIT), "i": 99, "j": job})])
    good.send(to, push(3, 2))
    bad.send(bad_to, [encode({"o": int(Data.PUSH), "i": 4, "j": "another", "c": 0})])
    good.send(to, push(5, 1))
    burst = server._transport.recv_burst(1.0, server._window)
    assert len(burst) == 7
    batch = server._batch(burst)
    assert [(h or {}).get("c") for _, _, h in batch] == [5, None, 2, 3, None, 1]
    assert [h is None for _, _, h in batch] == [False, True, False, False, True, False]
    credits = [good.recv(1.0) for _ in range(4)]  # one a push, as each was read
    assert [decode(e.frames[0], job)["i"] for e in credits if e is not None] == [1, 2, 3, 5]
    assert good.recv(0) is None
    server.state = ServerState.SERVING
    for peer, frames, header in batch:
        if header is None:
            server._serve(peer, frames, header)
    errors = [bad.recv(1.0) for _ in range(2)]
    codes = [decode(e.frames[0], job).get("code") for e in errors if e is not None]
    assert codes == ["malformed", "wrong_job"]
    assert good.recv(0) is None  # nothing for the good sender from the bad messages
