"""Every message trimtab sends, in one place.

A message is a list of frames: a msgpack-encoded header (a map with short keys) followed
by zero or more raw buffers (tensor bytes, never copied into the header). Control
messages (membership, placement, barriers) and data messages (chunk values and
gradients) are separate enums with disjoint codes, so a node can tell them apart from the
code alone.

Header keys common to every message (:class:`WireHeader`):
    ``j``: job id (a message from another job is refused),
    ``o``: the op code,
    ``i``: request id, echoed in the reply (0 for unsolicited messages).

The job id is no credential. A member proves its role with ``t``, the credential its
REGISTERED gave it (:mod:`trimtab.runtime.credentials`): a worker in every data request
to a server (with its rank ``r``), a server in every HANDOVER (with its index ``s``).

A PUSH's gradient or a VALUE's value of at most :data:`INLINE_MAX` bytes travels inside
the header, as its ``b`` (bytes), instead of as a frame of its own (:func:`inline`,
:func:`payload_frames`).

Each message's other keys, with a builder and a reader per message, are in
:mod:`trimtab.protocol.headers` (which also says what each short key means where).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, cast

import msgpack

from trimtab.errors import ProtocolError

if TYPE_CHECKING:
    # typing has NotRequired from 3.11; annotations here are never evaluated at run time
    # (PEP 563), so 3.10 imports this module as well.
    from typing import NotRequired

#: A header bigger than this is refused before it is decoded.
MAX_HEADER_BYTES = 64 * 1024

#: Tensor payloads up to this many bytes ride inside the header: one frame per message
#: instead of two (6 to 12% more round trips of a bare ZeroMQ echo here, BENCHMARKS.md),
#: for a copy of at most this much.
INLINE_MAX = 4096

#: A received header, as :func:`decode` returns it (the readers of
#: :mod:`trimtab.protocol.headers` check it and return it typed).
Header = dict[str, Any]


class WireHeader(TypedDict):
    """The keys every header has: the base of each message's typed header.

    ``i`` is set by the builder of a reply (or unsolicited message, 0), and by
    ``WorkerClient.request`` for a request; ``j`` by whichever sends it
    (``NodeLoop.send``, ``WorkerClient.request``).
    """

    o: int
    i: NotRequired[int]
    j: NotRequired[str]


class InlineHeader(WireHeader):
    """A header that may carry a small tensor inline (:func:`inline`)."""

    b: NotRequired[bytes | memoryview]


class Control(enum.IntEnum):
    """Coordinator traffic: membership, placement, barriers, broadcast, collectives,
    teardown.

    Each op's keys, builder and reader: :mod:`trimtab.protocol.headers`.
    """

    REGISTER = 1  # node -> coord {role, addr | rank}; reply REGISTERED
    REGISTERED = 2  # {rank, num_workers, num_servers, chunk_bytes, heartbeat_s}
    HEARTBEAT = 3  # node -> coord {lo?}, echoed by the coordinator
    DECLARE = 4  # worker -> coord {tensors, opt, t?}; reply MAP once all workers declared
    MAP = 5  # coord -> node: the job map {epoch, tensors, chunk_bytes, owners, servers,
    #          opt, workers, batching, consistency, tables?, ...}; or, answering MAP_GET, the
    #          published map {epoch, owners, servers, prev, cuts}
    MAP_ACK = 6  # server -> coord {epoch}, once it holds the chunks the map gives it
    BARRIER = 7  # worker -> coord {name}; reply OK when every worker arrived
    BCAST_PUT = 8  # root -> coord {key, meta} + buffers; reply OK
    BCAST_GET = 9  # worker -> coord {key}; reply BCAST_VALUE once it was put
    BCAST_VALUE = 10  # {meta} + buffers
    DONE = 11  # worker -> coord: my process ends (after LEAVE, or without); reply OK
    SHUTDOWN = 12  # coord -> node: the job ended normally (or this server retires), exit
    ABORT = 13  # coord -> node {why}: the job failed, exit
    OK = 14  # success: bare, or answering STATUS {status}, SCALE {target},
    #          REPORT {sizes?, epoch, refresh?, lead?}, LOAD {k: the job clock}
    ERROR = 15  # {code, msg}
    STATUS = 16  # tool -> coord; reply OK {servers, workers, epoch, owners, clocks, ...}
    REPORT = 17  # worker -> coord {k, b, cs, ms, cpu, lo, sv?}: a step's measurements;
    #              reply OK (under lbbsp once all workers reported)
    MIGRATE = 18  # coord -> server {the job map's keys, new epoch, owners, servers}
    MIGRATE_ACK = 19  # server -> coord {epoch, cuts}: the clock from which each chunk it
    #                   gives away belongs to its new owner
    HANDED = 20  # server -> coord {epoch, c}: these chunks reached their new owners
    MAP_GET = 21  # worker -> coord {e, lo}; reply MAP {epoch, owners, servers, prev, cuts}
    #               once a map of at least epoch e is published
    LOAD = 22  # server -> coord {busy, bytes, n, step}; reply OK {k}
    SCALE = 23  # tool -> coord {servers}: go to this many servers; reply OK {target}
    GATHER = 24  # worker -> coord {key, sig, meta} + its buffers: one worker's part of a
    #              collective (allreduce, allgather, broadcast, objects, join); reply
    #              GATHERED once every worker sent the key, ERROR (mismatch) if their sigs differ
    GATHERED = 25  # {metas, n, last} + every worker's buffers, in rank order
    EXTEND = 30  # coord -> server {the job map's keys with one more table, new epoch,
    #              owners}: hold, fresh, the new table's chunks given you; reply MAP_ACK
    LEAVE = 31  # worker -> coord {k}: shutdown(): out of the job for now, may init() again
    #             (k: each table's clock); reply OK. DONE follows when the process ends
    ADOPT = 36  # worker -> coord {root}: every worker adopts the root's values (a
    #             broadcast); reply OK {ad, g} once every worker asked: the grant that
    #             lets the root's INITs reset chunks the servers hold
    FAILOVER = 40  # coord -> server {e, owners, bk, servers, dead}: a server died, its
    #                chunks' backups own them from map e; reply FAILOVER_ACK. coord ->
    #                worker {e, dead: address}: resend what that server left unanswered
    FAILOVER_ACK = 41  # server -> coord {e}: it took failover map e
    HOLDINGS = 42  # coord -> server {e}: a server died during the migration to map e:
    #                which chunks do you hold, as owner or copy, and as of which round?
    HELD = 43  # server -> coord {e, h: [[chunk, round], ...]}: the newest of each it holds
    WORKERS = 45  # coord -> server {g, ws}: the workers taking part from now on (a lost
    #               one dropped: rounds waiting for it complete); reply WORKERS_ACK {g}
    WORKERS_ACK = 46  # server -> coord {g}: it aggregates over generation g's workers
    SCALE_WORKERS = 47  # tool -> coord {workers}: go to this many workers; reply OK {target}
    CHECKPOINT = 50  # tool -> coord: take a checkpoint now; reply OK {path} once complete
    SNAPSHOT = 51  # coord -> server {n, k, dir}: write your chunks as of clock k into dir
    SNAPSHOT_DONE = 52  # server -> coord {n, k, file? | late? | err?}: written, or too late
    #                     (a chunk is past clock k: late is its round), or failed
    RESTORE = 53  # coord -> server {dir, files}: load the chunks of the MAP that follows
    #               from these checkpoint files
    RESTORED = 54  # server -> coord {n | err}: chunks loaded (after that MAP), or why not
    MAP_NEWS = 58  # coord -> worker, unasked, as a migration's map is published: the
    #               published map {epoch, owners, servers, prev, cuts} (as MAP answers
    #               MAP_GET), adopted at the next step's first push (no MOVED round trips)
    REJOIN = 60  # node -> a replacement coordinator, after its coordinator died {role,
    #              rank, n: a nonce, ...}: a server's {addr, tk?, mk: the member key masked
    #              by the server key, jm: its job map, mv}; a worker's {pf, lo?}. Reply
    #              REJOINED once every member is back (see protocol.rejoin)
    REJOINED = 61  # coord -> node {pf}: the new coordinator's proof, then the job goes on


class Data(enum.IntEnum):
    """Worker <-> server traffic about chunks. A worker's requests (INIT, PUSH, PULL,
    STATS) carry its rank ``r`` and credential ``t``; a HANDOVER its sender's ``s``, ``t``.

    Each op's keys, builder and reader: :mod:`trimtab.protocol.headers`.
    """

    INIT = 64  # {c, e, dt, n, ad?, g?} + value; reply ACK. Sets a chunk's value: the
    #            seeding root's, once, before round 0; later only with an ADOPT grant
    PUSH = 65  # {c, e, dt, n, r, k, w, v, hp?, z?, g?, sm? | b?} + gradient (none with
    #            sm: the gradient is in shared memory, sm = [arena, offset, capacity]);
    #            reply VALUE when updated (g: the mean gradient, no update applied)
    PULL = 66  # {c, e}; reply VALUE now
    VALUE = 67  # {c, v, k, n, z? | dt, sm? | b?} + value (or aggregated gradient in
    #             summation mode); with sm, no frame: the value is in the push's slot
    MOVED = 68  # {c, s, e}: not the owner; s is the owner as this server knows it
    ACK = 69  # bare, or answering STATS {index, epoch, versions, pushes, ...}
    ERROR = 70  # {code, msg}
    STATS = 71  # worker -> server; reply ACK
    HANDOVER = 72  # server -> server {c, v, k, e, dt, n, p, hp?, st?} + value + state
    #                tensors; reply ACK
    STATE_GET = 80  # worker -> server {c, e}: the chunk's optimizer state; reply STATE
    STATE = 81  # server -> worker {c, v, k, hp, st} + state tensors, answering STATE_GET
    STATE_SET = 82  # worker -> server {c, e, hp?, st, dt?, n?} + value? + state tensors:
    #                 replace the chunk's optimizer state (and value, with dt); reply ACK
    REPLICATE = 84  # primary -> backup server {c, v, k, e, s, t, dt, n, p, ls, lc, hp?,
    #                 st?} + value + state tensors: the chunk as of round k; reply ACK
    BATCH = 99  # worker -> server {i, r, t, n} + the parts' frames: row PULLs and row
    #             PUSHes for one server, each part a whole request (its header frame,
    #             then its payload; n: each part's frame count); server -> worker
    #             {i, n} + each part's reply, once every part is answered
    #             (:mod:`trimtab.protocol.batch`)
    CREDIT = 98  # server -> worker {i}: the PUSH of request i (sent with ak) was read off
    #              the socket; sent on receipt, before the push is merged or answered;
    #              worker -> server {i}: the VALUE answering request i (sent with ak) was
    #              read; the server sends the values it held back for that worker


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
    INTERNAL = "internal"  # the node failed on a well-formed request (a bug): it goes on
    STALE_EPOCH = "stale_epoch"  # a write under a map older than a failover the
    #                              receiver took, from a server no longer the owner
    FORBIDDEN = "forbidden"  # the sender has no credential for this, or its role may not
    #                          send it (a worker's data request without its 't', a server
    #                          joining that the coordinator did not ask for, ...)


def encode(header: Mapping[str, Any]) -> bytes:
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
    # (Each test asks the exact type first, as every message has it: the isinstance
    # calls behind it run only for another type, with the same outcome as before.)
    if type(header) is not dict and not isinstance(header, dict):
        raise ProtocolError(ErrorCode.MALFORMED.value, "header is not a map")
    op = header.get("o")
    if type(op) is not int and (not isinstance(op, int) or isinstance(op, bool)):
        raise ProtocolError(ErrorCode.MALFORMED.value, "header has no integer op 'o'")
    rid = header.setdefault("i", 0)
    if type(rid) is not int and not isinstance(rid, int):
        raise ProtocolError(ErrorCode.MALFORMED.value, "request id 'i' is not an integer")
    if header.get("j") != job:
        raise ProtocolError(
            ErrorCode.WRONG_JOB.value,
            f"message for job {header.get('j')!r} reached a node of job {job!r}; "
            "check TRIMTAB_JOB / --job on the sender",
        )
    return header


def inline(header: Header | InlineHeader, payload: memoryview) -> list[memoryview]:
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
    """Return ``header[key]`` checked against ``kind``; raise a MALFORMED ProtocolError.
    ``int`` refuses a bool. Does not block."""
    value = header.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            f"op {header.get('o')}: field {key!r} is missing or not {_kind_name(kind)}",
        )
    return value


def optional(header: Header, key: str, kind: type | tuple[type, ...]) -> Any:
    """``header[key]`` checked as :func:`field` does, or ``None`` if the key is absent.
    Raises a MALFORMED ProtocolError for a present key of another type. Does not block."""
    return field(header, key, kind) if key in header else None


#: What :func:`field` takes for a number: an int or a float.
NUMBER = (int, float)

#: Keys and their types, for :func:`fields`.
KeySpec = tuple[tuple[str, type | tuple[type, ...]], ...]


def fields(header: Header, required: KeySpec, optional_keys: KeySpec = ()) -> None:
    """Check each key of ``required`` as :func:`field` does, and each of
    ``optional_keys`` as :func:`optional`; raise a MALFORMED ProtocolError at the first
    that fails. Does not block."""
    for key, kind in required:
        field(header, key, kind)
    for key, kind in optional_keys:
        optional(header, key, kind)


def int_list(header: Header, key: str) -> list[int]:
    """``header[key]`` checked to be a list of ints; raise a MALFORMED ProtocolError."""
    items = field(header, key, list)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        raise ProtocolError(
            ErrorCode.MALFORMED.value, f"op {header.get('o')}: {key!r} is not a list of ints"
        )
    return cast(list[int], items)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


class ErrorHeader(WireHeader):
    """ERROR (data or control plane), a refusal: the node goes on serving."""

    code: str  # an ErrorCode value
    msg: str  # what was wrong and, where it helps, what to do


def error_header(job: str, rid: int, code: str, msg: str, *, data: bool) -> ErrorHeader:
    """Build an ERROR reply header for the data or the control plane. Does not block."""
    return {
        "j": job,
        "o": int(Data.ERROR if data else Control.ERROR),
        "i": rid,
        "code": code,
        "msg": msg,
    }


def read_error(header: Header) -> ErrorHeader:
    """A received ERROR, checked: ``code`` and ``msg`` are strings. Raises a MALFORMED
    :class:`ProtocolError` if either is missing or not a string. Does not block."""
    field(header, "code", str)
    field(header, "msg", str)
    return cast(ErrorHeader, header)


def error_of(exc: ProtocolError) -> tuple[str, str]:
    """Split a ProtocolError raised by :func:`decode`/:func:`field` into (code, msg)."""
    if len(exc.args) == 2:
        return str(exc.args[0]), str(exc.args[1])
    return ErrorCode.MALFORMED.value, str(exc)
