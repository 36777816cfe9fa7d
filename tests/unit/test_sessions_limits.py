"""What a ZeroMQ peer's message may be: every limit holds on the quick path for a header
and a payload as on the full check."""

from __future__ import annotations

import pytest

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


def test_two_frames_are_refused_where_one_is_the_most() -> None:
    sessions = ZmqSessions(None, Limits(max_frame_bytes=1000, max_frames=1))
    assert sessions.on_dealer("tcp://127.0.0.1:1", _frames(1, 1))[0] is None
    assert sessions.refused == 1
