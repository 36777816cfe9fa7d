"""Wire dtype names and their sizes. Pure, standard library only."""

from __future__ import annotations

from collections.abc import Mapping

#: Wire dtype names and their sizes. bfloat16 travels as raw bytes.
DTYPE_SIZES: Mapping[str, int] = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
}
