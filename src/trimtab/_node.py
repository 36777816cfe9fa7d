"""What every node's event loop shares: framing replies and errors, heartbeats."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trimtab._exceptions import ProtocolError
from trimtab._messages import DTYPE_SIZES, Control, ErrorCode, Header, encode, error_header, field
from trimtab._transport import Frame, Peer, Transport

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
WIRE_DTYPES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}


#: Sent to a process of a job, makes it print every thread's stack to stderr and go on
#: (``kill -USR1 PID``; the launcher sends it to every process of a job that ran past
#: its deadline).
STACK_SIGNAL = signal.SIGUSR1


#: What each node of this process says of its protocol state on :data:`STACK_SIGNAL`
#: (see :func:`add_state_dump`).
_state_dumps: list[Callable[[], str]] = []


def enable_stack_dumps() -> None:
    """On :data:`STACK_SIGNAL`, print every thread's stack to stderr, then what each
    node of this process registered with :func:`add_state_dump` (its requests in
    flight, chunks, migrations: what a hung job needs explained), if the process does
    not handle that signal already and this is its main thread. Does not block or
    raise."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(STACK_SIGNAL) is signal.SIG_DFL:
        # The stacks come from faulthandler's own handler, which works whatever the
        # threads are doing; it then chains to this one, which runs in the main thread
        # at its next bytecode (a poll is interrupted and resumed for it).
        signal.signal(STACK_SIGNAL, _print_state)
        faulthandler.register(STACK_SIGNAL, all_threads=True, chain=True)


def add_state_dump(describe: Callable[[], str]) -> Callable[[], None]:
    """Have ``describe()`` printed on :data:`STACK_SIGNAL` (after the stacks); returns
    the function that takes it back. ``describe`` runs in the main thread between two
    bytecodes of whatever it was doing, so it must only read. Never blocks or raises."""
    _state_dumps.append(describe)

    def remove() -> None:
        if describe in _state_dumps:
            _state_dumps.remove(describe)

    return remove


def _print_state(signum: int, frame: object) -> None:
    for describe in list(_state_dumps):
        try:
            text = describe()
        except Exception as exc:  # a half-updated structure: say so, never raise here
            text = f"(state unavailable: {type(exc).__name__}: {exc})"
        print(text, file=sys.stderr, flush=True)


def wire_dtype(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype. Raises ``ValueError`` for unsupported ones."""
    try:
        return WIRE_DTYPES[dtype]
    except KeyError:
        raise ValueError(
            f"trimtab moves floating-point tensors ({sorted(TORCH_DTYPES)}), not {dtype}"
        ) from None


def as_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor (any dtype, bfloat16 included)."""
    array: Any = t.view(-1).view(torch.uint8).numpy()
    return memoryview(array)


def tensor_from(frame: memoryview, dtype: str, numel: int) -> torch.Tensor:
    """A tensor over a received frame, without copying. The frame must outlive it."""
    if frame.readonly:
        # torch refuses read-only buffers; zmq frames are writable, test copies are not.
        frame = memoryview(bytearray(frame))
    return torch.frombuffer(frame, dtype=TORCH_DTYPES[dtype], count=numel)


#: Gradients of these chunk dtypes may travel compressed to these (``compression=``).
COMPRESSED_DTYPES: dict[str, tuple[str, ...]] = {
    "float32": ("float16", "bfloat16"),
    "float64": ("float16", "bfloat16"),
}


def check_tensor_frames(
    header: Header,
    frames: Sequence[memoryview],
    dtype: str,
    numel: int,
    *,
    compressed: bool = False,
) -> torch.Tensor:
    """Validate a message that carries one tensor buffer of ``numel`` ``dtype`` elements
    (or, if ``compressed`` may be, of a narrower dtype of :data:`COMPRESSED_DTYPES`).

    Raises :class:`ProtocolError` (BAD_DTYPE, BAD_SHAPE or MALFORMED) saying what differs.
    """
    got_dtype = field(header, "dt", str)
    if got_dtype != dtype and not (compressed and got_dtype in COMPRESSED_DTYPES.get(dtype, ())):
        raise ProtocolError(
            ErrorCode.BAD_DTYPE.value, f"chunk holds {dtype}, message carries {got_dtype!r}"
        )
    dtype = got_dtype
    got_n = field(header, "n", int)
    if got_n != numel:
        raise ProtocolError(
            ErrorCode.BAD_SHAPE.value, f"chunk has {numel} elements, message says {got_n}"
        )
    if len(frames) != 1:
        raise ProtocolError(
            ErrorCode.MALFORMED.value, f"expected 1 tensor frame, got {len(frames)}"
        )
    expected = numel * DTYPE_SIZES[dtype]
    if frames[0].nbytes != expected:
        raise ProtocolError(
            ErrorCode.BAD_SHAPE.value,
            f"tensor frame is {frames[0].nbytes} bytes, {numel} x {dtype} needs {expected} "
            "(truncated or padded frame)",
        )
    return tensor_from(frames[0], dtype, numel)


class NodeLoop:
    """Helpers for a node's single-threaded event loop over a :class:`Transport`.

    Not thread-safe: only the loop's thread uses it.
    """

    def __init__(self, job: str, transport: Transport, log: logging.Logger) -> None:
        self.job = job
        self.transport = transport
        self.log = log
        self.errors_sent = 0

    def send(self, peer: Peer, header: Header, frames: Sequence[Frame] = ()) -> None:
        header["j"] = self.job
        self.transport.send(peer, [encode(header), *frames])

    def refuse(self, peer: Peer, rid: int, code: str, msg: str, *, data: bool) -> None:
        """Answer a request with an error; the node goes on serving."""
        self.errors_sent += 1
        self.log.warning("refused a request from %r: [%s] %s", peer, code, msg)
        self.transport.send(peer, [encode(error_header(self.job, rid, code, msg, data=data))])


class Heartbeat:
    """Sends HEARTBEAT to the coordinator every ``interval_s`` and notices its silence."""

    def __init__(self, interval_s: float, timeout_s: float) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        now = time.monotonic()
        self._last_sent = 0.0
        self.last_heard = now

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last_sent >= self.interval_s:
            self._last_sent = now
            return True
        return False

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard

    def header(self) -> dict[str, Any]:
        return {"o": int(Control.HEARTBEAT), "i": 0}
