"""What a ZeroMQ peer's message may be: every limit holds on the quick path for a header
and a payload as on the full check."""

from __future__ import annotations

import pytest

from trimtab.errors import ConfigError
from trimtab.transport.limits import Limits
from trimtab.transport.sessions import ZmqSessions


def _frames(*sizes: int) -> list[memoryview]:
    return [memoryview(bytes(n)) for n in sizes]


@pytest.mark.parametrize(
    ("sizes", "fits"),
    [
        ((10, 990), True),  # the quick path: header and payload within a frame's limit
        ((600, 600), True),  # each frame fits, 1200 of 1500 in all: the full check
        ((10, 1001), False),  # a frame over max_frame_bytes
        ((900, 900), False),  # each fits, 1800 bytes over max_message_bytes
        ((10, 10, 10), True),
        ((1, 1, 1, 1), False),  # over max_frames
        ((1000,), True),  # the quick path of one frame (a CREDIT)
        ((1001,), False),  # one frame over max_frame_bytes
        ((), False),  # no frame at all
    ],
)
def test_a_message_from_a_peer_is_taken_only_within_the_limits(
    sizes: tuple[int, ...], fits: bool
) -> None:
    sessions = ZmqSessions(None, Limits(max_frame_bytes=1000, max_frames=3, max_message_bytes=1500))
    for received in (
        sessions.on_dealer("tcp://127.0.0.1:1", _frames(*sizes))[0],
        sessions.on_router(b"peer", _frames(*sizes))[0],
    ):
        assert (received is not None) is fits
    assert sessions.refused == (0 if fits else 2)


def test_one_frame_is_held_to_the_message_limit_where_it_is_the_lower() -> None:
    sessions = ZmqSessions(None, Limits(max_frame_bytes=1000, max_frames=3, max_message_bytes=500))
    assert sessions.on_router(b"peer", _frames(500))[0] is not None
    assert sessions.on_router(b"peer", _frames(501))[0] is None
    assert sessions.on_dealer("tcp://127.0.0.1:1", _frames(501))[0] is None
    assert sessions.refused == 2


def test_two_frames_are_refused_where_one_is_the_most() -> None:
    sessions = ZmqSessions(None, Limits(max_frame_bytes=1000, max_frames=1))
    assert sessions.on_dealer("tcp://127.0.0.1:1", _frames(1, 1))[0] is None
    assert sessions.refused == 1


@pytest.mark.parametrize(
    "sizes",
    [(), (10,), (1000,), (1001,), (10, 990), (600, 600), (10, 1001), (900, 900), (1, 1, 1, 1)],
)
def test_a_message_sent_passes_the_quick_check_as_it_passes_the_full_one(
    sizes: tuple[int, ...],
) -> None:
    # Headers as bytes, payloads as byte views of float tensors (len() counts elements).
    limits = Limits(max_frame_bytes=1000, max_frames=3, max_message_bytes=1500)
    frames = [bytes(n) if i == 0 else memoryview(bytes(n)).cast("B") for i, n in enumerate(sizes)]
    if len(sizes) == 2 and sizes[1] % 4 == 0:
        frames[1] = memoryview(bytes(sizes[1])).cast("f")
    fits = not limits.check_lengths(list(sizes))
    if fits:
        limits.check_frames_sent(frames)
    else:
        with pytest.raises(ConfigError):
            limits.check_frames_sent(frames)
