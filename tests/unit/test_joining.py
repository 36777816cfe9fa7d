"""A joining server keeps the data messages that come before its REGISTERED (see
:mod:`trimtab.roles.server.joining`)."""

from __future__ import annotations

from trimtab.roles.server import joining
from trimtab.roles.server.joining import Joining


def test_messages_before_registration_are_kept_as_copies_in_their_order() -> None:
    j = Joining()
    buf = bytearray(b"replicate-1")
    assert j.hold(b"i:s0", [memoryview(buf)], {"o": 84})
    assert j.hold(b"i:s1", [memoryview(b"push")], None)
    buf[:] = b"overwritten"  # a lane reuses its buffer for the next message
    held = j.release()
    assert [(p, [bytes(f) for f in fr], h) for p, fr, h in held] == [
        (b"i:s0", [b"replicate-1"], {"o": 84}),
        (b"i:s1", [b"push"], None),
    ]
    assert j.release() == []


def test_the_hold_is_bounded_in_messages_and_bytes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(joining, "HOLD_MAX", 2)
    monkeypatch.setattr(joining, "HOLD_MAX_BYTES", 10)
    j = Joining()
    assert j.hold(b"p", [memoryview(b"12345")], None)
    assert not j.hold(b"p", [memoryview(b"123456")], None)  # 11 bytes: over
    assert j.hold(b"p", [memoryview(b"6789")], None)
    assert not j.hold(b"p", [memoryview(b"")], None)  # 3 messages: over
    assert len(j.release()) == 2
    assert j.hold(b"p", [memoryview(b"123456789")], None)  # released: room again
