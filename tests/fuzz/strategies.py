"""Hypothesis strategies shared by the fuzz tests: msgpack values, headers of every op
with plausible and implausible fields, and tensor frames."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from trimtab.protocol.messages import Control, Data

#: Every short key a header of some op carries, and a few no op has.
KEYS = [
    *"ojiceknrwvbszt",
    "dt", "sm", "hp", "st", "p", "lo", "cs", "ms", "cpu", "sv", "tk", "key", "role",
    "addr", "rank", "epoch", "owners", "servers", "name", "meta", "servers", "why",
    "code", "msg", "tensors", "opt", "workers", "chunk_bytes", "cuts", "busy", "bytes",
    "step", "num_workers", "num_servers", "heartbeat_s", "status", "target", "x",
    "ls", "lc", "bk", "dead",
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.integers(min_value=-3, max_value=70)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.binary(max_size=24)
)

values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=10,
)

OPS = [int(op) for op in (*Control, *Data)]
ops = st.sampled_from(OPS) | st.integers(min_value=-5, max_value=300)


def headers_of(
    job: str, fixed: dict[str, Any] | None = None, keys: list[str] | None = None
) -> st.SearchStrategy[dict[str, Any]]:
    """Headers of job ``job`` (usually) with an op, then any of ``keys`` (default
    :data:`KEYS`) holding anything, then ``fixed`` over them."""
    base = st.fixed_dictionaries(
        {"o": ops},
        optional={"j": st.just(job) | st.text(max_size=4), "i": st.integers(0, 2**31)},
    )
    extra = st.dictionaries(st.sampled_from(keys or KEYS), values, max_size=8)

    def merge(parts: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
        header, more = parts
        merged = {**more, **header}
        merged.setdefault("j", job)
        return {**merged, **(fixed or {})}

    return st.tuples(base, extra).map(merge)


def frames(sizes: list[int]) -> st.SearchStrategy[list[bytes]]:
    """Zero to two frames, of one of ``sizes`` bytes (a chunk's, say) or any."""
    one = st.sampled_from(sizes).flatmap(lambda n: st.binary(min_size=n, max_size=n)) | st.binary(
        max_size=64
    )
    return st.lists(one, max_size=2)
