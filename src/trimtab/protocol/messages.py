"""Every message trimtab sends, in one place.

A message is a list of frames: a msgpack-encoded header (a map with short keys) followed
by zero or more raw buffers (tensor bytes, never copied into the header). Control
messages (membership, placement, barriers) and data messages (chunk values and
gradients) are separate enums with disjoint codes, so a node can tell them apart from the
code alone.

Header keys common to every message:
    ``j``: job id (a message from another job is refused),
    ``o``: the op code,
    ``i``: request id, echoed in the reply (0 for unsolicited messages).

A PUSH's gradient or a VALUE's value of at most :data:`INLINE_MAX` bytes travels inside
the header, as its ``b`` (bytes), instead of as a frame of its own (:func:`inline`,
:func:`payload_frames`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import msgpack

from trimtab.errors import ProtocolError

#: A header bigger than this is refused before it is decoded.
MAX_HEADER_BYTES = 64 * 1024

#: Tensor payloads up to this many bytes ride inside the header: one frame per message
#: instead of two (6 to 12% more round trips of a bare ZeroMQ echo here, BENCHMARKS.md),
#: for a copy of at most this much.
INLINE_MAX = 4096

Header = dict[str, Any]


class Control(enum.IntEnum):
    """Coordinator traffic: membership, placement, barriers, broadcast, teardown."""

    REGISTER = 1  # node -> coord {role, rank, addr}; reply REGISTERED
    REGISTERED = 2  # {rank, num_workers, num_servers, chunk_bytes, heartbeat_s}
    HEARTBEAT = 3  # node -> coord {lo?: a worker's, as in MAP_GET}, no reply
    DECLARE = 4  # worker -> coord {tensors, opt}; reply MAP once all workers declared
    MAP = 5  # {epoch, tensors, chunks, owners, servers, opt, workers}
    MAP_ACK = 6  # server -> coord, once it holds the chunks the map gives it
    BARRIER = 7  # worker -> coord {name}; reply OK when every worker arrived
    BCAST_PUT = 8  # root -> coord {key, meta} + buffers; reply OK
    BCAST_GET = 9  # worker -> coord {key}; reply BCAST_VALUE once it was put
    BCAST_VALUE = 10  # {meta} + buffers
    DONE = 11  # worker -> coord: my script finished; reply OK
    SHUTDOWN = 12  # coord -> node: the job ended normally, exit
    ABORT = 13  # coord -> node {why}: the job failed, exit
    OK = 14  # generic success reply
    ERROR = 15  # {code, msg}
    STATUS = 16  # anyone -> coord; reply OK {members, epoch, clocks}
    REPORT = 17  # worker -> coord {k, b, cs, ms, cpu, lo}: a step's measurements;
    #              reply OK {sizes?, refresh?, lead?} (under lbbsp once all workers reported)
    MIGRATE = 18  # coord -> server {epoch, owners, servers, prev, + MAP fields}: a new map
    MIGRATE_ACK = 19  # server -> coord {epoch, cuts}: the clock from which each chunk it
    #                   gives away belongs to its new owner
    HANDED = 20  # server -> coord {epoch, c}: these chunks reached their new owners
    MAP_GET = 21  # worker -> coord {e, lo}; reply MAP {epoch, owners, servers, prev, cuts}
    #               once a map of at least epoch e is published. lo (also in REPORT): the
    #               oldest map by which the worker has a data request unanswered
    LOAD = 22  # server -> coord {busy, bytes, n}: cumulative busy seconds, bytes handled
    SCALE = 23  # tool -> coord {servers}: go to this many servers; reply OK {target}


class Data(enum.IntEnum):
    """Worker <-> server traffic about chunks."""

    INIT = 64  # {c, e, dt, n} + value; reply ACK. Sets a chunk's value (root worker).
    PUSH = 65  # {c, e, k, w, dt, n, z, hp?, sm?} + gradient (none with sm: the gradient
    #            is in shared memory, sm = [arena, offset, capacity]); reply VALUE when updated
    PULL = 66  # {c, e}; reply VALUE now
    VALUE = 67  # {c, v, k, dt, n, sm?} + value (or aggregated gradient in summation mode);
    #             with sm, no frame: the value is in the push's shared-memory slot
    MOVED = 68  # {c, s, e}: not the owner; s is the owner as this server knows it
    ACK = 69
    ERROR = 70  # {code, msg}
    STATS = 71  # anyone -> server; reply ACK {chunks, versions, pushes}
    HANDOVER = 72  # server -> server {c, v, k, e, hp, st} + value + state tensors; reply ACK


class ErrorCode(str, enum.Enum):
    """Machine-readable error codes carried by ERROR replies."""

    MALFORMED = "malformed"  # undecodable header, missing or mistyped field
    TOO_LARGE = "too_large"  # header or buffer over the limit
    WRONG_JOB = "wrong_job"  # message from another job
    UNKNOWN_OP = "unknown_op"
    UNKNOWN_CHUNK = "unknown_chunk"
    BAD_DTYPE = "bad_dtype"
    BAD_SHAPE = "bad_shape"  # element count or byte length does not match the chunk
    BAD_STATE = "bad_state"  # legal message at an illegal time (e.g. push before init)
    MISMATCH = "mismatch"  # workers declared different tensors
    NO_SHM = "no_shm"  # the server cannot map the push's shared memory: send bytes instead


def encode(header: Header) -> bytes:
    """Encode a header. Does not block; raises ``TypeError`` on unencodable values."""
    return msgpack.packb(header, use_bin_type=True)  # type: ignore[no-any-return]


def decode(frame: bytes | memoryview, job: str) -> Header:
    """Decode and check the common fields of a header frame.

    Does not block. Raises :class:`ProtocolError` whose first argument is an
    :class:`ErrorCode` value, so a node can answer with the code and the message.
    """
    if len(frame) > MAX_HEADER_BYTES:
        raise ProtocolError(
            ErrorCode.TOO_LARGE.value,
            f"header of {len(frame)} bytes is over the {MAX_HEADER_BYTES}-byte limit",
        )
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(
            ErrorCode.MALFORMED.value, f"header is not valid msgpack ({exc})"
        ) from None
    if not isinstance(header, dict):
        raise ProtocolError(ErrorCode.MALFORMED.value, "header is not a map")
    op = header.get("o")
    if not isinstance(op, int) or isinstance(op, bool):
        raise ProtocolError(ErrorCode.MALFORMED.value, "header has no integer op 'o'")
    rid = header.setdefault("i", 0)
    if not isinstance(rid, int):
        raise ProtocolError(ErrorCode.MALFORMED.value, "request id 'i' is not an integer")
    if header.get("j") != job:
        raise ProtocolError(
            ErrorCode.WRONG_JOB.value,
            f"message for job {header.get('j')!r} reached a node of job {job!r}; "
            "check TRIMTAB_JOB / --job on the sender",
        )
    return header


def inline(header: Header, payload: memoryview) -> list[memoryview]:
    """Put ``payload`` into ``header`` (as ``b``) if it is small; return the frames that
    must follow the header: none, or the payload. Does not block or copy (the header's
    encoding copies an inline payload)."""
    if payload.nbytes <= INLINE_MAX:
        header["b"] = payload
        return []
    return [payload]


def payload_frames(header: Header, frames: Sequence[memoryview]) -> list[memoryview]:
    """The tensor frames of a received message: its inline payload, if any, then the
    frames after the header. Raises a MALFORMED :class:`ProtocolError` if ``b`` is not
    bytes."""
    if "b" not in header:
        return list(frames)
    inlined = header.pop("b")
    if not isinstance(inlined, bytes):
        raise ProtocolError(ErrorCode.MALFORMED.value, "inline payload 'b' is not bytes")
    return [memoryview(inlined), *frames]


def field(header: Header, key: str, kind: type | tuple[type, ...]) -> Any:
    """Return ``header[key]`` checked against ``kind``; raise a MALFORMED ProtocolError."""
    value = header.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            f"op {header.get('o')}: field {key!r} is missing or not {_kind_name(kind)}",
        )
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def error_header(job: str, rid: int, code: str, msg: str, *, data: bool) -> Header:
    """Build an ERROR reply header for the data or the control plane."""
    return {
        "j": job,
        "o": int(Data.ERROR if data else Control.ERROR),
        "i": rid,
        "code": code,
        "msg": msg,
    }


def error_of(exc: ProtocolError) -> tuple[str, str]:
    """Split a ProtocolError raised by :func:`decode`/:func:`field` into (code, msg)."""
    if len(exc.args) == 2:
        return str(exc.args[0]), str(exc.args[1])
    return ErrorCode.MALFORMED.value, str(exc)
