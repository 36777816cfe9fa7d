"""Gradient compression: names, Horovod's compressor classes, and which dtypes narrow."""

from __future__ import annotations

import pytest
import torch

import trimtab
from trimtab.errors import ConfigError, ProtocolError
from trimtab.frontend.compression import compressor
from trimtab.runtime.tensors import check_tensor_frames


def test_names_and_objects_resolve() -> None:
    assert compressor(None) is trimtab.Compression.none
    assert compressor("FP16") is trimtab.Compression.fp16
    assert compressor(trimtab.Compression.bf16) is trimtab.Compression.bf16

    class FP16Compressor:  # the name Horovod's and BytePS's classes go by
        pass

    assert compressor(FP16Compressor) is trimtab.Compression.fp16


def test_unknown_compression_says_what_to_use() -> None:
    with pytest.raises(ConfigError, match=r"Compression\.none"):
        compressor("int8")


def test_only_wide_float_gradients_are_narrowed() -> None:
    fp16 = trimtab.Compression.fp16
    assert fp16.wire_dtype(torch.float32) == torch.float16
    assert fp16.wire_dtype(torch.float64) == torch.float16
    assert fp16.wire_dtype(torch.bfloat16) == torch.bfloat16
    assert trimtab.Compression.bf16.wire_dtype(torch.float32) == torch.bfloat16
    assert trimtab.Compression.none.wire_dtype(torch.float32) == torch.float32


def test_server_accepts_a_narrower_gradient_only_when_compressed() -> None:
    frame = memoryview(bytearray(torch.ones(4, dtype=torch.float16).numpy().tobytes()))
    header = {"dt": "float16", "n": 4}
    t = check_tensor_frames(header, [frame], "float32", 4, compressed=True)
    assert t.dtype == torch.float16 and t.tolist() == [1.0] * 4
    with pytest.raises(ProtocolError, match="float32"):
        check_tensor_frames(header, [frame], "float32", 4)
    # A wider dtype is never a compression: still refused.
    wide = memoryview(bytearray(8 * 4))
    with pytest.raises(ProtocolError, match="float64"):
        check_tensor_frames({"dt": "float64", "n": 4}, [wide], "float32", 4, compressed=True)
