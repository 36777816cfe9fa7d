"""Tensors on the wire: torch dtypes by wire name, zero-copy byte views, and the checks of a
received tensor frame. The one runtime module that needs torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ConfigError, ProtocolError
from trimtab.protocol.messages import ErrorCode, Header, field

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
WIRE_DTYPES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}


def wire_dtype(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype. Raises :class:`ConfigError` for unsupported ones."""
    try:
        return WIRE_DTYPES[dtype]
    except KeyError:
        raise ConfigError(
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
