"""Chunks and the placement map: the data model every role shares.

Every named tensor is cut into chunks of at most ``chunk_bytes``; a chunk is the unit of
aggregation, placement and migration. The :class:`PlacementMap` says which server owns
each chunk and carries an epoch that every change increments. Pure, standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A named tensor as workers declare it.

    Attributes:
        name: unique name (from ``named_parameters``).
        shape: the tensor's shape.
        dtype: wire dtype name (a key of ``DTYPE_SIZES``).
        group: index of the optimizer param group it belongs to.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    group: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_wire(self) -> list[Any]:
        return [self.name, list(self.shape), self.dtype, self.group]

    @classmethod
    def from_wire(cls, raw: Any) -> TensorSpec:
        """Parse a declared tensor. Raises ``ValueError`` with what is wrong."""
        if not (isinstance(raw, list | tuple) and len(raw) == 4):
            raise ValueError(f"tensor spec {raw!r} is not [name, shape, dtype, group]")
        name, shape, dtype, group = raw
        if not isinstance(name, str) or not isinstance(group, int):
            raise ValueError(f"tensor spec {raw!r} has a bad name or group")
        if not isinstance(shape, list | tuple) or not all(
            isinstance(d, int) and d >= 0 for d in shape
        ):
            raise ValueError(f"tensor {name!r} has a bad shape {shape!r}")
        if dtype not in DTYPE_SIZES:
            raise ValueError(
                f"tensor {name!r} has dtype {dtype!r}; trimtab handles {sorted(DTYPE_SIZES)}"
            )
        return cls(name, tuple(shape), dtype, group)


@dataclasses.dataclass(frozen=True)
class ChunkSpec:
    """A contiguous slice ``[offset, offset + numel)`` of a flattened tensor."""

    id: int
    tensor: int
    part: int
    offset: int
    numel: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES[self.dtype]


def make_chunks(tensors: Sequence[TensorSpec], chunk_bytes: int) -> list[ChunkSpec]:
    """Cut tensors into chunks of at most ``chunk_bytes``, as even in size as possible.

    Chunk ids are dense, in tensor order then offset order. Pure; raises
    :class:`ConfigError` for a non-positive ``chunk_bytes``.
    """
    if chunk_bytes <= 0:
        raise ConfigError(f"chunk_bytes must be positive, got {chunk_bytes}")
    chunks: list[ChunkSpec] = []
    for t_index, t in enumerate(tensors):
        per_chunk = max(1, chunk_bytes // DTYPE_SIZES[t.dtype])
        n = t.numel
        parts = max(1, -(-n // per_chunk))
        base, extra = divmod(n, parts)
        offset = 0
        for part in range(parts):
            size = base + (1 if part < extra else 0)
            chunks.append(ChunkSpec(len(chunks), t_index, part, offset, size, t.dtype))
            offset += size
    return chunks


@dataclasses.dataclass(frozen=True)
class PlacementMap:
    """Which server owns each chunk, as of ``epoch``.

    Attributes:
        epoch: increments with every change of owners or servers.
        owners: server index per chunk id.
        servers: server addresses by index.
    """

    epoch: int
    owners: tuple[int, ...]
    servers: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Every field, as plain lists and numbers (JSON's): what :meth:`from_dict` takes.
        A field added later travels with it. Pure."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
        }

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any], **changes: Any) -> PlacementMap:
        """The map :meth:`to_dict` gave, with ``changes`` (e.g. the ``servers`` of a
        resumed job); fields it lacks take their defaults. Raises :class:`ConfigError`
        for a field this class does not have or a missing one without a default."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(saved) - names)
        if unknown:
            raise ConfigError(f"a saved placement map has fields {unknown} this trimtab lacks")
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in {**saved, **changes}.items()
        }
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"a saved placement map is incomplete: {exc}") from None
