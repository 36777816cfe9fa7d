"""The codec and the local lane's parser, fuzzed: arbitrary bytes and arbitrary
headers are refused with a ProtocolError (a lane: LaneClosed), never anything else."""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.strategies import headers_of, values
from trimtab.errors import ProtocolError
from trimtab.protocol import headers, messages
from trimtab.protocol.messages import decode, encode, error_of, payload_frames
from trimtab.transport.auth import JobKey, ServerHandshake
from trimtab.transport.lane import LaneClosed, LaneConnection
from trimtab.transport.limits import Limits

JOB = "fuzz"

#: Every reader of a received message: each raises ProtocolError for a bad header.
READERS = sorted(
    {getattr(headers, n) for n in headers.__all__ if n.startswith("read_")} | {messages.read_error},
    key=lambda f: f.__name__,
)


def test_every_message_has_a_reader_here() -> None:
    assert len(READERS) >= 25  # a new reader is fuzzed without a change here


@given(st.binary(max_size=256))
def test_decode_refuses_arbitrary_bytes(frame: bytes) -> None:
    try:
        header = decode(frame, JOB)
    except ProtocolError as exc:
        code, msg = error_of(exc)
        assert code in {c.value for c in messages.ErrorCode} and msg
    else:
        assert isinstance(header["o"], int) and header["j"] == JOB


@given(values)
def test_decode_refuses_any_msgpack_value_that_is_no_header(value: Any) -> None:
    try:
        frame = msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return
    with contextlib.suppress(ProtocolError):
        decode(frame, JOB)


@pytest.mark.parametrize("reader", READERS, ids=lambda f: f.__name__)
@given(header=headers_of(JOB))
def test_readers_refuse_what_they_cannot_read(reader: Any, header: dict[str, Any]) -> None:
    try:
        frame = encode(header)
        decoded = decode(frame, JOB)
        payload_frames(decoded, [])
        reader(decoded)
    except ProtocolError as exc:
        assert error_of(exc)[1]
    except (TypeError, ValueError, OverflowError):
        pass  # (encode: hypothesis drew a value msgpack cannot hold; nothing to decode)


# -- the local lane's parser ----------------------------------------------------------

#: The lane parser under test: a connection's reading end over ``sock``, with small
#: limits (checked from the prefix, before anything is allocated), behind the secret's
#: handshake or not (a job with authentication turned off).
MAX_FRAME = 4096
MAX_FRAMES = 64
LIMITS = Limits(max_frame_bytes=MAX_FRAME, max_frames=MAX_FRAMES, max_message_bytes=4 * MAX_FRAME)


def lane_reader(sock: socket.socket, handshake: bool) -> LaneConnection:
    shake = ServerHandshake(JobKey(bytes(32))) if handshake else None
    return LaneConnection(sock, b"i:fuzz", LIMITS, shake)


def lane_prefix(lengths: list[int]) -> bytes:
    """A lane message's prefix: its frame count and lengths (any, even absurd)."""
    return struct.pack(f"<I{len(lengths)}Q", len(lengths), *lengths)


def lane_message(lengths: list[int], fill: bytes) -> bytes:
    """A whole lane message of frames of ``lengths`` bytes (small ones), ``fill``ed."""
    body = (fill or b"\0") * (sum(lengths) + 1)
    return lane_prefix(lengths) + body[: sum(lengths)]


pieces = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lane_message,
        st.lists(st.integers(0, MAX_FRAME + 2), min_size=0, max_size=6),
        st.binary(max_size=8),
    ),
    st.builds(
        lambda n, lengths: lane_prefix(lengths)[:n],
        st.integers(0, 40),
        st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=3),
    ),
    st.integers(0, MAX_FRAMES + 2).map(lambda c: c.to_bytes(4, "little")),
)


@given(st.lists(pieces, max_size=6), st.booleans(), st.booleans())
def test_the_lane_parser_takes_any_byte_stream(
    chunks: list[bytes], close: bool, handshake: bool
) -> None:
    """Any bytes: whole messages within the limits, or the connection refused (closed);
    behind the handshake, no message at all from a peer that never proved the secret."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = lane_reader(ours, handshake)
    scratch = memoryview(bytearray(1 << 12))
    try:
        for chunk in chunks:
            theirs.sendall(chunk)
            try:
                messages_, closed = conn.read(scratch)
            except LaneClosed:
                return  # refused: the transport drops the connection
            assert not (handshake and messages_), "a message before the secret was proven"
            for frames in messages_:
                assert 0 < len(frames) <= MAX_FRAMES
                assert all(f.nbytes <= MAX_FRAME for f in frames)
            assert not closed
        if close:
            theirs.close()
            with contextlib.suppress(LaneClosed):
                conn.read(scratch)
    finally:
        conn.close()
        theirs.close()
