"""P3's credit as pure logic: the gate (a bound on bytes in flight per peer, held
messages released first layers first), the server's receipts (a CREDIT per push that
asks for one, before anything is merged; its values held to each worker's window and
released by that worker's CREDITs), and CREDIT's codec."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trimtab.core.chunks import ChunkSpec
from trimtab.errors import ConfigError, ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.credit import CreditFrames
from trimtab.protocol.messages import Control, Data, decode, encode
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.receipt import Receipts
from trimtab.roles.server.store import Chunk, Reply
from trimtab.runtime.credit import ENV, ONE_CHUNK, CreditGate, window_from_env
from trimtab.transport import Envelope

MIB = 1 << 20


def test_pushes_within_the_window_go_at_once_the_rest_wait_for_credit() -> None:
    gate: CreditGate[str, str] = CreditGate(2 * MIB)
    assert gate.admit("s0", 1, MIB, 5, "c5")
    assert gate.admit("s0", 2, MIB, 4, "c4")
    assert not gate.admit("s0", 3, MIB, 3, "c3")  # the window is full: held
    assert gate.in_flight("s0") == 2 * MIB and gate.holding()
    # Another server has a window of its own.
    assert gate.admit("s1", 4, 2 * MIB, 9, "other")
    assert gate.credit("s0", 1) == ["c3"]
    assert gate.in_flight("s0") == 2 * MIB and not gate.holding()
    assert gate.stats.peak_bytes == 2 * MIB
    assert (gate.stats.admitted, gate.stats.held) == (3, 1)
    assert gate.outstanding == 3  # s0: rids 2 and 3; s1: rid 4


def test_held_pushes_are_released_first_layers_first() -> None:
    """Backward pushes the last layers first; once credit returns, the held push of the
    lowest chunk id goes, whatever order they were pushed in."""
    gate: CreditGate[str, int] = CreditGate(MIB)
    assert gate.admit("s", 100, MIB, 7, 7)
    for rid, chunk in enumerate((6, 5, 4, 3, 2, 1, 0), start=101):
        assert not gate.admit("s", rid, MIB, chunk, chunk)
    order = []
    rid = 100
    for _ in range(7):
        released = gate.credit("s", rid)
        assert len(released) == 1  # one chunk's worth of window: one at a time
        order.append(released[0])
        rid = 107 - released[0]  # the request id it was pushed with
    assert order == [0, 1, 2, 3, 4, 5, 6]
    assert gate.stats.peak_bytes == MIB


def test_a_push_of_higher_priority_waits_behind_none_held_after_it() -> None:
    """A new push while others are held is held too (it may not overtake the window),
    but it goes before them if its priority is higher."""
    gate: CreditGate[str, str] = CreditGate(MIB)
    assert gate.admit("s", 1, MIB, 9, "c9")
    assert not gate.admit("s", 2, MIB, 8, "c8")
    assert not gate.admit("s", 3, MIB // 2, 0, "c0")
    # c0 and c8 do not both fit (1.5 MiB in a 1 MiB window): c0 goes first, c8 after.
    assert gate.credit("s", 1) == ["c0"]
    assert gate.credit("s", 3) == ["c8"]


def test_release_fills_the_window_in_priority_order() -> None:
    gate: CreditGate[str, str] = CreditGate(MIB)
    assert gate.admit("s", 1, MIB, 9, "c9")
    assert not gate.admit("s", 2, MIB // 2, 8, "c8")
    assert not gate.admit("s", 3, MIB // 2, 0, "c0")
    assert not gate.admit("s", 4, MIB // 2, 1, "c1")
    assert gate.credit("s", 1) == ["c0", "c1"]  # both fit; c8 waits
    assert gate.credit("s", 3) == ["c8"]


def test_arrival_order_when_not_ordered() -> None:
    gate: CreditGate[str, str] = CreditGate(MIB, ordered=False)
    assert gate.admit("s", 1, MIB, 9, "c9")
    for rid, chunk in ((2, 8), (3, 0), (4, 5)):
        assert not gate.admit("s", rid, MIB, chunk, f"c{chunk}")
    assert [gate.credit("s", rid)[0] for rid in (1, 2, 3)] == ["c8", "c0", "c5"]


def test_a_push_bigger_than_the_window_goes_alone() -> None:
    gate: CreditGate[str, str] = CreditGate(MIB)
    assert gate.admit("s", 1, 3 * MIB, 0, "big")  # nothing in flight: it goes
    assert not gate.admit("s", 2, 1, 1, "small")
    assert gate.credit("s", 1) == ["small"]
    assert not gate.admit("s", 3, 3 * MIB, 0, "big again")  # something in flight: wait
    assert gate.credit("s", 2) == ["big again"]


def test_unknown_and_repeated_credit_change_nothing() -> None:
    """A reply also credits its push (in case no CREDIT came): the CREDIT that came
    first already did, and a reply to a request that was never gated does nothing."""
    gate: CreditGate[str, str] = CreditGate(MIB)
    assert gate.admit("s", 1, MIB, 0, "a")
    assert not gate.admit("s", 2, MIB, 1, "b")
    assert gate.credit("s", 99) == [] and gate.credit("elsewhere", 1) == []
    assert gate.credit("s", 1) == ["b"]
    assert gate.credit("s", 1) == []
    assert gate.in_flight("s") == MIB
    assert "1048576 bytes in flight" in gate.describe()


def test_the_window_from_the_environment() -> None:
    assert window_from_env({}) == ONE_CHUNK
    assert window_from_env({ENV: "0"}) == 0
    assert window_from_env({ENV: "65536"}) == 65536
    for bad in ("-1", "4MiB"):
        with pytest.raises(ConfigError, match=ENV):
            window_from_env({ENV: bad})
    with pytest.raises(ConfigError):
        CreditGate(0)


def test_credit_codec() -> None:
    h = decode(encode({**headers.credit(rid=42), "j": "job"}), "job")
    assert h["o"] == Data.CREDIT == 98 and headers.read_credit(h)["i"] == 42
    with pytest.raises(ProtocolError):
        headers.read_credit({"o": int(Data.CREDIT), "i": "x"})


def test_a_credit_encoded_from_its_cached_prefix_decodes_as_the_builders() -> None:
    frames = CreditFrames("job")
    for rid in (0, 1, 127, 128, 65535, 65536, 2**32, 2**63 - 1):
        assert decode(frames(rid), "job") == {**headers.credit(rid=rid), "j": "job"}


class _Loop:
    """A NodeLoop's send, recorded (and its transport's, for messages encoded already:
    decoded as the peer would)."""

    job = "job"

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, dict[str, Any]]] = []
        self.transport = self
        self.gathered: dict[Any, Any] = {}  # (NodeLoop's: no batch waits for a reply)

    def send(self, peer: bytes, header: dict[str, Any], frames: Any = ()) -> None:
        if isinstance(header, list):  # the transport's send: [header frame, *frames]
            header = decode(header[0], self.job)
        self.sent.append((peer, dict(header)))


def _push(rid: int, chunk: int, ak: bool) -> list[memoryview]:
    header = headers.push(
        chunk=chunk, epoch=1, dtype="float32", numel=4, rank=0, clock=0, weight=1.0, version=0
    )
    header.update({"i": rid, "j": "job"})
    if ak:
        header["ak"] = True
    return [memoryview(encode(header)), memoryview(bytes(16))]


def test_the_server_credits_each_push_that_asks_as_it_reads_it() -> None:
    loop = _Loop()
    batch = [
        Envelope(b"i:w0", _push(7, 3, ak=True)),
        Envelope(b"i:w1", _push(8, 3, ak=False)),  # a worker with no bound: no CREDIT
        Envelope(b"i:w1", [memoryview(b"\xc1garbage")]),  # undecodable: refused in turn
        Envelope(
            b"i:w0",
            [memoryview(encode({"o": int(Data.PULL), "i": 9, "j": "job", "ak": True}))],
        ),
        Envelope(b"coord", [memoryview(encode({"o": int(Control.OK), "i": 0, "j": "job"}))]),
        Envelope(b"i:w2", _push(10, 1, ak=True)),
    ]
    out = Receipts(loop, LoadMeter()).acknowledge(batch, b"coord")  # type: ignore[arg-type]
    assert [(peer, h["o"], h["i"]) for peer, h in loop.sent] == [
        (b"i:w0", int(Data.CREDIT), 7),
        (b"i:w2", int(Data.CREDIT), 10),
    ]
    # Same order, same frames; headers decoded once, for the handler (None: undecodable,
    # or the coordinator's, which its own handler reads).
    assert [m[0] for m in out] == [m.peer for m in batch]
    assert [m[1] for m in out] == [m.frames for m in batch]
    assert out[0][2] is not None and out[0][2]["c"] == 3
    assert out[2][2] is None
    assert out[4][2] is None


def test_the_servers_credits_are_creditframes_bytes_for_every_size_of_rid() -> None:
    """Receipts builds a CREDIT from CreditFrames' prefix and its own kept packer: the
    same bytes, whatever the rid's msgpack integer's width."""

    class _Raw(_Loop):
        def __init__(self) -> None:
            super().__init__()
            self.raw: list[bytes] = []

        def send(self, peer: bytes, header: Any, frames: Any = ()) -> None:
            self.raw.append(bytes(header[0]))

    loop = _Raw()
    receipts = Receipts(loop, LoadMeter())  # type: ignore[arg-type]
    rids = (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1)
    receipts.acknowledge([Envelope(b"i:w0", _push(rid, 3, ak=True)) for rid in rids], b"coord")
    assert loop.raw == [CreditFrames("job")(rid) for rid in rids]


def _chunk(cid: int, numel: int) -> Chunk:
    chunk = Chunk(ChunkSpec(cid, cid, 0, 0, numel, "float32"), None)
    chunk.value.fill_(float(cid))
    return chunk


def _credit_from(peer: bytes, rid: int) -> Envelope:
    return Envelope(peer, [memoryview(encode({"o": int(Data.CREDIT), "i": rid, "j": "job"}))])


def test_a_server_holds_values_to_the_workers_window_and_releases_first_layers_first() -> None:
    """Rounds complete last layers first; past the worker's window (its pushes' vk) the
    values wait, and each value the worker credits releases the held one of the lowest
    chunk id. Another worker's window is its own."""
    loop = _Loop()
    receipts = Receipts(loop, LoadMeter())  # type: ignore[arg-type]
    chunks = {cid: _chunk(cid, MIB // 4) for cid in range(4)}  # 1 MiB each
    window = 2 * MIB
    for rid, cid in zip((13, 12, 11, 10), (3, 2, 1, 0), strict=True):  # backward's order
        receipts.value(b"i:w0", rid, chunks[cid], chunks[cid].value, 1, None, window)
    receipts.value(b"i:w1", 20, chunks[3], chunks[3].value, 1, None, window)
    assert [(p, h["c"], h.get("ak")) for p, h in loop.sent] == [
        (b"i:w0", 3, True),
        (b"i:w0", 2, True),
        (b"i:w1", 3, True),  # not held behind w0's values
    ]
    loop.sent.clear()
    # w0 read chunk 3's value: chunk 0's, the first layer's, goes before chunk 1's.
    out = receipts.acknowledge([_credit_from(b"i:w0", 13)], b"coord")
    assert out == []  # a CREDIT is consumed here, never handled as a request
    assert [(p, h["c"], h["i"]) for p, h in loop.sent] == [(b"i:w0", 0, 10)]
    receipts.acknowledge([_credit_from(b"i:w0", 12)], b"coord")
    assert [h["c"] for _, h in loop.sent] == [0, 1]
    # A credit from a peer the gate never sent to, or for a value it never held back,
    # releases nothing.
    receipts.acknowledge([_credit_from(b"i:w9", 10), _credit_from(b"i:w0", 99)], b"coord")
    assert len(loop.sent) == 2
    assert receipts.values.stats.held == 2


def test_values_into_shared_memory_or_for_an_unbounded_worker_are_never_held() -> None:
    loop = _Loop()
    receipts = Receipts(loop, LoadMeter())  # type: ignore[arg-type]
    big = _chunk(0, MIB)  # 4 MiB: over any window here
    for rid in range(1, 4):
        receipts.value(b"i:w0", rid, big, big.value, 1, None, 0)  # no vk: not bounded
    small = _chunk(1, 4)  # 16 bytes: inline in the header, no frame to hold
    for rid in range(4, 7):
        receipts.value(b"i:w1", rid, small, small.value, 1, None, 1)
    assert len(loop.sent) == 6
    assert all("ak" not in h for _, h in loop.sent)
    assert receipts.values.stats.held == 0


class _FramesLoop(_Loop):
    """A NodeLoop's send, with the frames' bytes as they are when sent."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: list[bytes] = []

    def send(self, peer: bytes, header: dict[str, Any], frames: Any = ()) -> None:
        super().send(peer, header, frames)
        if isinstance(header, list):  # the transport's send: [header frame, *frames]
            frames = header[1:]
        self.payloads.append(b"".join(bytes(f) for f in frames))


@pytest.mark.parametrize("what", ["sum", "async value"])
def test_a_held_value_goes_out_as_it_was_when_its_round_completed(what: str) -> None:
    """A round's sum (summation mode) is overwritten by the next round's first push, and
    in an asynchronous job any push updates the value: another worker may push again
    before this worker's held value leaves. It must leave with the bytes of its round
    (the test bed's summation-mode equivalence test diverged by 0.013 without this)."""
    loop = _FramesLoop()
    receipts = Receipts(loop, LoadMeter(), synchronous=lambda: what != "async value")  # type: ignore[arg-type]
    first, second = _chunk(0, MIB // 4), _chunk(1, MIB // 4)
    t = (lambda c: c.merge) if what == "sum" else (lambda c: c.value)
    for c in (first, second):
        t(c).fill_(1.0)
    receipts.value(b"i:w0", 1, first, t(first), 1, None, MIB)
    receipts.value(b"i:w0", 2, second, t(second), 1, None, MIB)  # held: the window is full
    t(second).fill_(2.0)  # the next round (another worker's push) reuses the buffer
    receipts.acknowledge([_credit_from(b"i:w0", 1)], b"coord")
    assert [h["c"] for _, h in loop.sent] == [0, 1]
    assert loop.payloads[1] == torch.ones(MIB // 4).numpy().tobytes()


class _KeptLoop(_Loop):
    """A NodeLoop's send, keeping the frames themselves (a transport that reads them
    later, as ZeroMQ's I/O thread does)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[list[Any]] = []

    def send(self, peer: bytes, header: dict[str, Any], frames: Any = ()) -> None:
        super().send(peer, header, frames)
        if isinstance(header, list):  # the transport's send: [header frame, *frames]
            frames = header[1:]
        self.frames.append(list(frames))


@pytest.mark.parametrize("window", [0, MIB])
@pytest.mark.parametrize("synchronous", [True, False])
def test_a_value_sent_at_once_is_a_copy_only_where_a_push_may_change_it(
    window: int, synchronous: bool
) -> None:
    """In an asynchronous job the next push updates the value in place, maybe before the
    transport has read the frame: the frame must hold the bytes of the value as it was
    sent (else the worker reads a value torn between two versions). Under BSP the chunk
    changes only after this worker pushed again: the frame is a view (no copy)."""
    loop = _KeptLoop()
    receipts = Receipts(loop, LoadMeter(), synchronous=lambda: synchronous)  # type: ignore[arg-type]
    chunk = _chunk(0, MIB // 4)
    chunk.value.fill_(1.0)
    receipts.value(b"i:w0", 1, chunk, chunk.value, 1, None, window)
    chunk.value.fill_(2.0)  # the next push's update, before the transport read the frame
    (frame,) = loop.frames[0]
    expected = torch.full((MIB // 4,), 2.0 if synchronous else 1.0).numpy().tobytes()
    assert bytes(frame) == expected


def test_what_is_held_for_a_worker_that_left_is_dropped() -> None:
    """A worker that left the job (the coordinator's WORKERS) never reads nor credits
    the values held for it; a worker joining in a lost one's place has a new socket,
    which starts with a window of its own."""
    loop = _Loop()
    receipts = Receipts(loop, LoadMeter())  # type: ignore[arg-type]
    chunks = [_chunk(cid, MIB // 4) for cid in range(3)]

    def reply(peer: bytes, rank: int, rid: int, chunk: Chunk) -> None:
        r = Reply(peer, rid, rank, 1, chunk, None, MIB)  # type: ignore[arg-type]
        r.value, r.round = chunk.value, 1
        receipts.reply(r)

    for rid, chunk in enumerate(chunks, start=1):
        reply(b"i:w0", 0, rid, chunk)
        reply(b"i:w1", 1, 10 + rid, chunk)
    assert receipts.values.stats.held == 4  # two per worker
    receipts.workers([0])  # rank 1 left
    assert receipts.values.in_flight(b"i:w1") == 0
    receipts.acknowledge([_credit_from(b"i:w1", 11)], b"coord")
    assert [p for p, _ in loop.sent].count(b"i:w1") == 1  # nothing more for it
    # Rank 0's process is replaced: its old socket's credit ends, the new one's starts.
    reply(b"i:w0-new", 0, 1, chunks[0])
    assert receipts.values.in_flight(b"i:w0") == 0
    assert receipts.values.in_flight(b"i:w0-new") == MIB
