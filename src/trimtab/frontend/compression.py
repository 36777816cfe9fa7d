"""Gradient compression on the wire: Horovod's ``compression=`` argument.

A worker may send its gradients as float16 or bfloat16 instead of float32 (or float64):
half the bytes on the push. The servers widen them back as they merge (the sum is in the
chunk's own dtype), and the updated values come back in full precision, so only the
pushed gradients are rounded (a relative error of about 2^-11 for fp16, 2^-8 for bf16).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from trimtab.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where tensors are handled, not by the launcher
    import torch

__all__ = ["ENV", "Compression", "Compressor", "compressor"]

#: The job's default gradient compression, set by ``trimtab run --compression``.
ENV = "TRIMTAB_COMPRESSION"


@dataclasses.dataclass(frozen=True)
class Compressor:
    """A wire format for gradients; also Horovod's compressor interface
    (:meth:`compress`, :meth:`decompress`), for custom use and ``trimtab.allreduce``.

    Attributes:
        name: ``none``, ``fp16`` or ``bf16``.
        wire: the dtype (wire name) float32 and float64 gradients travel in; ``None``
            for their own.
    """

    name: str
    wire: str | None

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a gradient of ``dtype`` is sent as: only float32 and float64 are
        narrowed (half-precision gradients go as they are)."""
        import torch

        if self.wire is None or dtype not in (torch.float32, torch.float64):
            return dtype
        return torch.float16 if self.wire == "float16" else torch.bfloat16

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(compressed, ctx)``: ``tensor`` in this format's wire dtype (itself if
        unchanged), and what :meth:`decompress` needs (its dtype). Never blocks."""
        wire = self.wire_dtype(tensor.dtype)
        return (tensor if wire == tensor.dtype else tensor.to(wire)), tensor.dtype

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``tensor`` back in the dtype :meth:`compress` saw (``ctx``; None: as it is).
        Never blocks."""
        if ctx is None or tensor.dtype == ctx:
            return tensor
        return tensor.to(ctx)


class Compression:
    """The compressors, under Horovod's names: ``trimtab.Compression.none``,
    ``trimtab.Compression.fp16``, and ``trimtab.Compression.bf16``."""

    none = Compressor("none", None)
    fp16 = Compressor("fp16", "float16")
    bf16 = Compressor("bf16", "bfloat16")


_BY_NAME = {c.name: c for c in (Compression.none, Compression.fp16, Compression.bf16)}
# Horovod's and BytePS's compressor classes, so their scripts run with the import swapped.
_FOREIGN = {"nonecompressor": Compression.none, "fp16compressor": Compression.fp16}


def compressor(value: object) -> Compressor:
    """The :class:`Compressor` that ``value`` names: a :class:`Compressor`, ``None``, a
    name (``"none"``, ``"fp16"``, ``"bf16"``), or Horovod's ``Compression.none`` /
    ``Compression.fp16``. Never blocks. Raises :class:`ConfigError` for anything else."""
    if value is None:
        return Compression.none
    if isinstance(value, Compressor):
        return value
    if isinstance(value, str) and value.lower() in _BY_NAME:
        return _BY_NAME[value.lower()]
    foreign = _FOREIGN.get(str(getattr(value, "__name__", "")).lower())
    if foreign is not None:
        return foreign
    raise ConfigError(
        f"unknown gradient compression {value!r}; use trimtab.Compression.none, "
        f".fp16 or .bf16 (or the names 'none', 'fp16', 'bf16')"
    )
