"""Batches of row requests (protocol/batch.py): a worker's requests for one server go
in one message and their replies come back in one; a malformed batch is refused whole
before any part is served; each part's reply finds its own request."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import msgpack
import pytest

from trimtab.errors import ProtocolError, RemoteError
from trimtab.protocol import batch
from trimtab.protocol.messages import Data, decode, encode
from trimtab.roles.server.batches import Batches
from trimtab.roles.worker.batching import HeldRequests
from trimtab.runtime.loop import NodeLoop

JOB = "j1"


class _Wire:
    """What a node's loop sends, kept (the loop's transport, without sockets)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, list[Any]]] = []

    def send(self, peer: Any, frames: Sequence[Any]) -> None:
        self.sent.append((peer, list(frames)))


def _part(op: int, rid: int, **extra: Any) -> list[bytes]:
    header = {"o": op, "i": rid, "j": JOB, "c": rid, "e": 1, "r": 0, "t": b"ok", **extra}
    return [encode(header), b"\x00" * 8]


def _credential(h: dict[str, Any]) -> None:
    if h.get("t") != b"ok":
        raise ProtocolError("forbidden", "no credential")


def _loop() -> tuple[NodeLoop, _Wire]:
    wire = _Wire()
    return NodeLoop(JOB, wire, logging.getLogger("test")), wire  # type: ignore[arg-type]


def _open(
    batches: Batches, parts: list[list[bytes]], rid: int = 100, peer: str = "peer", rank: int = 0
) -> list[Any]:
    frames = batch.pack(rid, JOB, parts)
    header = decode(frames[0], JOB)
    return batches.open(peer, rank, header, [memoryview(f) for f in frames[1:]], _credential)


def test_a_batchs_replies_leave_together_in_order_once_every_part_is_answered() -> None:
    loop, wire = _loop()
    batches = Batches(loop)
    parts = [_part(Data.PUSH, rid, sr=1) for rid in (7, 8, 9)]
    opened = _open(batches, parts)
    assert [h["i"] for _, h in opened] == [7, 8, 9]
    # Replies as rounds complete: out of order, one a MOVED; another peer's goes out.
    loop.send("peer", {"o": int(Data.VALUE), "i": 9, "c": 9})
    loop.send("other", {"o": int(Data.VALUE), "i": 7})
    loop.send("peer", {"o": int(Data.MOVED), "i": 7, "c": 7, "s": 1, "e": 2})
    assert [peer for peer, _ in wire.sent] == ["other"]
    loop.refuse("peer", 8, "bad_shape", "no", data=True)
    assert len(wire.sent) == 2 and not loop.gathered
    peer, frames = wire.sent[1]
    header = msgpack.unpackb(frames[0])
    assert peer == "peer" and header["o"] == Data.BATCH and header["i"] == 100
    got = batch.unpack(header, [memoryview(f) for f in frames[1:]])
    assert [msgpack.unpackb(p[0])["i"] for p in got] == [7, 8, 9]
    assert [msgpack.unpackb(p[0])["o"] for p in got] == [Data.MOVED, Data.ERROR, Data.VALUE]
    assert batches.opened == 1 and batches.parts == 3 and batches.open_batches == 0


def test_a_lost_workers_batches_are_forgotten_and_the_others_kept() -> None:
    loop, wire = _loop()
    batches = Batches(loop)
    _open(batches, [_part(Data.PULL, rid, sr=1) for rid in (7, 8)], peer="a", rank=0)
    _open(batches, [_part(Data.PULL, rid, sr=1) for rid in (7, 9)], 101, peer="b", rank=1)
    loop.send("a", {"o": int(Data.VALUE), "i": 7})  # one part of worker 0's batch answered
    assert batches.open_batches == 2 and len(loop.gathered) == 3
    # Worker 0 is lost: nothing stays owed to it; worker 1's batch still gathers.
    assert batches.workers([1]) == 1
    assert batches.open_batches == 1 and set(loop.gathered) == {("b", 7), ("b", 9)}
    loop.send("a", {"o": int(Data.VALUE), "i": 8})  # (late: goes alone, to nobody's batch)
    loop.send("b", {"o": int(Data.VALUE), "i": 9})
    loop.send("b", {"o": int(Data.VALUE), "i": 7})
    assert [peer for peer, _ in wire.sent] == ["a", "b"] and not loop.gathered
    assert msgpack.unpackb(wire.sent[1][1][0])["o"] == Data.BATCH
    assert batches.open_batches == 0 and batches.workers([1]) == 0


@pytest.mark.parametrize(
    "parts",
    [
        [_part(Data.PUSH, 7, sr=1), _part(Data.PUSH, 8)],  # a dense push: not a row request
        [_part(Data.PUSH, 7, sr=1), _part(Data.INIT, 8, sr=1)],  # an op batches do not carry
        [_part(Data.PULL, 7, sr=1), _part(Data.PULL, 7, sr=1)],  # one request id twice
        [_part(Data.PULL, 7, sr=1), _part(Data.PULL, 0, sr=1)],  # no request id of its own
        [_part(Data.PULL, 7, sr=1), _part(Data.PULL, 8, sr=1, t=b"x")],  # no credential
        [_part(Data.PULL, 7, sr=1), [encode({"o": int(Data.PULL), "i": 8, "j": "other"})]],
    ],
    ids=["dense", "init", "twice", "no-id", "forbidden", "wrong-job"],
)
def test_a_bad_batch_is_refused_whole_with_nothing_owed(parts: list[list[bytes]]) -> None:
    loop, _ = _loop()
    with pytest.raises(ProtocolError):
        _open(Batches(loop), parts)
    assert not loop.gathered  # no part registered: none will be served


@pytest.mark.parametrize(
    "counts",
    [None, [], [0, 2], [1, 1], [2, 5], [1] * (batch.MAX_PARTS + 1), [1.0, 1]],
    ids=["none", "empty", "zero", "short", "too-many-frames", "too-many-parts", "float"],
)
def test_a_batch_whose_counts_do_not_add_up_is_refused_before_any_part(counts: Any) -> None:
    frames = [memoryview(b"h"), memoryview(b"d"), memoryview(b"h")]
    with pytest.raises(ProtocolError, match="batch"):
        batch.unpack({"o": int(Data.BATCH), "n": counts}, frames)


def test_held_requests_go_one_message_per_server_and_their_replies_find_them() -> None:
    held = HeldRequests()
    held.hold("a", 1, [b"h1", b"x"])
    held.hold("b", 2, [b"h2"])
    held.hold("a", 3, [b"h3", b"y", b"z"])
    out = held.take(itertools.count(10), JOB, {"r": 0, "t": b"ok"})
    assert not held
    (to_a, frames_a), (to_b, frames_b) = out
    assert to_b == "b" and frames_b == [b"h2"]  # a lone request goes as it is
    header = decode(frames_a[0], JOB)
    assert to_a == "a" and header["o"] == Data.BATCH and header["n"] == [2, 3]
    assert header["r"] == 0 and frames_a[1:] == [b"h1", b"x", b"h3", b"y", b"z"]
    assert held.owns(10)
    # Refused whole: every part's future fails with the server's error.
    futures: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in "ab"]
    pending: dict[int, Any] = {1: futures[0], 3: futures[1]}
    error = {"o": int(Data.ERROR), "i": 10, "code": "malformed", "msg": "bad"}
    assert held.answered(error, [], pending, threading.Lock()) == []
    assert not pending and not held.owns(10)
    assert all(isinstance(f.exception(), RemoteError) for f in futures)


def test_a_batchs_reply_is_taken_apart_into_its_parts() -> None:
    held = HeldRequests()
    held.hold("a", 1, [b"h1"])
    held.hold("a", 2, [b"h2"])
    assert len(held.take(itertools.count(5), JOB, {})) == 1
    reply = batch.pack(5, JOB, [[b"v1", b"d"], [b"v2"]])
    header = decode(reply[0], JOB)
    parts = held.answered(header, [memoryview(f) for f in reply], {}, threading.Lock())
    assert [[bytes(f) for f in p] for p in parts] == [[b"v1", b"d"], [b"v2"]]
    # A reply that does not add up fails its parts, as a refusal does.
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    held.hold("a", 1, [b"h1"])
    held.hold("a", 2, [b"h2"])
    held.take(itertools.count(6), JOB, {})
    bad = {"o": int(Data.BATCH), "i": 6, "n": [1, 1]}
    assert held.answered(bad, [memoryview(b"h")], {1: fut}, threading.Lock()) == []
    assert isinstance(fut.exception(), ProtocolError)
