"""P3's send side as pure logic: the worker's credit gate (a bound on push bytes in
flight per server, held pushes released first layers first), the server's receipts
(a CREDIT per push that asks for one, before anything is merged), and CREDIT's codec."""

from __future__ import annotations

from typing import Any

import pytest

from trimtab.errors import ConfigError, ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, Data, decode, encode
from trimtab.roles.server.receipt import acknowledge
from trimtab.roles.worker.credit import DEFAULT_WINDOW, ENV, CreditGate, window_from_env

MIB = 1 << 20


def test_pushes_within_the_window_go_at_once_the_rest_wait_for_credit() -> None:
    gate: CreditGate[str] = CreditGate(2 * MIB)
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
    gate: CreditGate[int] = CreditGate(MIB)
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
    gate: CreditGate[str] = CreditGate(MIB)
    assert gate.admit("s", 1, MIB, 9, "c9")
    assert not gate.admit("s", 2, MIB, 8, "c8")
    assert not gate.admit("s", 3, MIB // 2, 0, "c0")
    # c0 and c8 do not both fit (1.5 MiB in a 1 MiB window): c0 goes first, c8 after.
    assert gate.credit("s", 1) == ["c0"]
    assert gate.credit("s", 3) == ["c8"]


def test_release_fills_the_window_in_priority_order() -> None:
    gate: CreditGate[str] = CreditGate(MIB)
    assert gate.admit("s", 1, MIB, 9, "c9")
    assert not gate.admit("s", 2, MIB // 2, 8, "c8")
    assert not gate.admit("s", 3, MIB // 2, 0, "c0")
    assert not gate.admit("s", 4, MIB // 2, 1, "c1")
    assert gate.credit("s", 1) == ["c0", "c1"]  # both fit; c8 waits
    assert gate.credit("s", 3) == ["c8"]


def test_arrival_order_when_not_ordered() -> None:
    gate: CreditGate[str] = CreditGate(MIB, ordered=False)
    assert gate.admit("s", 1, MIB, 9, "c9")
    for rid, chunk in ((2, 8), (3, 0), (4, 5)):
        assert not gate.admit("s", rid, MIB, chunk, f"c{chunk}")
    assert [gate.credit("s", rid)[0] for rid in (1, 2, 3)] == ["c8", "c0", "c5"]


def test_a_push_bigger_than_the_window_goes_alone() -> None:
    gate: CreditGate[str] = CreditGate(MIB)
    assert gate.admit("s", 1, 3 * MIB, 0, "big")  # nothing in flight: it goes
    assert not gate.admit("s", 2, 1, 1, "small")
    assert gate.credit("s", 1) == ["small"]
    assert not gate.admit("s", 3, 3 * MIB, 0, "big again")  # something in flight: wait
    assert gate.credit("s", 2) == ["big again"]


def test_unknown_and_repeated_credit_change_nothing() -> None:
    """A reply also credits its push (in case no CREDIT came): the CREDIT that came
    first already did, and a reply to a request that was never gated does nothing."""
    gate: CreditGate[str] = CreditGate(MIB)
    assert gate.admit("s", 1, MIB, 0, "a")
    assert not gate.admit("s", 2, MIB, 1, "b")
    assert gate.credit("s", 99) == [] and gate.credit("elsewhere", 1) == []
    assert gate.credit("s", 1) == ["b"]
    assert gate.credit("s", 1) == []
    assert gate.in_flight("s") == MIB
    assert "1048576 bytes in flight" in gate.describe()


def test_the_window_from_the_environment() -> None:
    assert window_from_env({}) == DEFAULT_WINDOW
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


class _Loop:
    """A NodeLoop's send, recorded."""

    job = "job"

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, dict[str, Any]]] = []

    def send(self, peer: bytes, header: dict[str, Any], frames: Any = ()) -> None:
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
        (b"i:w0", _push(7, 3, ak=True), None),
        (b"i:w1", _push(8, 3, ak=False), None),  # a worker with no bound: no CREDIT
        (b"i:w1", [memoryview(b"\xc1garbage")], None),  # undecodable: refused in turn
        (
            b"i:w0",
            [memoryview(encode({"o": int(Data.PULL), "i": 9, "j": "job", "ak": True}))],
            None,
        ),
        (b"coord", [memoryview(encode({"o": int(Control.OK), "i": 0, "j": "job"}))], None),
        (b"i:w2", _push(10, 1, ak=True), None),
    ]
    out = acknowledge(batch, loop)  # type: ignore[arg-type]
    assert [(peer, h["o"], h["i"]) for peer, h in loop.sent] == [
        (b"i:w0", int(Data.CREDIT), 7),
        (b"i:w2", int(Data.CREDIT), 10),
    ]
    # Same order, same frames; headers decoded once, for the handler (None: undecodable).
    assert [m[0] for m in out] == [m[0] for m in batch]
    assert [m[1] for m in out] == [m[1] for m in batch]
    assert out[0][2] is not None and out[0][2]["c"] == 3
    assert out[2][2] is None
