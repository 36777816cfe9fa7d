"""Chunks, the placement map, and the placement policies.

Every named tensor is cut into chunks of at most ``chunk_bytes``; a chunk is the unit of
aggregation, placement and (later) migration. The :class:`PlacementMap` says which
server owns each chunk and carries an epoch that every change increments.

Placement policies are pure: they map a chunk table and a server count to owners.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from trimtab._exceptions import ConfigError
from trimtab._messages import DTYPE_SIZES
from trimtab._registry import Registry


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

    def owner(self, chunk: int) -> int:
        return self.owners[chunk]

    def chunks_of(self, server: int) -> list[int]:
        return [c for c, s in enumerate(self.owners) if s == server]


class PlacementPolicy(abc.ABC):
    """Decides the initial owner of every chunk. Pure: no I/O, no clock."""

    name: ClassVar[str]

    @abc.abstractmethod
    def place(
        self, tensors: Sequence[TensorSpec], chunks: Sequence[ChunkSpec], num_servers: int
    ) -> list[int]:
        """Return the owning server index of each chunk (same order as ``chunks``)."""


PLACEMENTS: Registry[PlacementPolicy] = Registry("placement")


def djb2(text: str) -> int:
    """The djb2 string hash BytePS uses to assign partitions, on 64 bits."""
    h = 5381
    for ch in text.encode():
        h = (h * 33 + ch) & 0xFFFFFFFFFFFFFFFF
    return h


@PLACEMENTS.register("hash")
class HashPlacement(PlacementPolicy):
    """BytePS-like: each chunk to ``djb2(tensor_name + ':' + part) % servers``."""

    name = "hash"

    def place(
        self, tensors: Sequence[TensorSpec], chunks: Sequence[ChunkSpec], num_servers: int
    ) -> list[int]:
        return [djb2(f"{tensors[c.tensor].name}:{c.part}") % num_servers for c in chunks]


#: MXNet's ``MXNET_KVSTORE_BIGARRAY_BOUND`` default.
MXNET_BIGARRAY_BOUND = 1_000_000


@PLACEMENTS.register("mxnet")
class MxnetPlacement(PlacementPolicy):
    """MXNet's KVStore rule: an array under 10^6 elements goes whole to server
    ``(key * 9973) % servers`` (key = declaration index); a larger one is sliced evenly
    over all servers (its chunks in contiguous runs, one run per server)."""

    name = "mxnet"

    def place(
        self, tensors: Sequence[TensorSpec], chunks: Sequence[ChunkSpec], num_servers: int
    ) -> list[int]:
        counts = [0] * len(tensors)
        for c in chunks:
            counts[c.tensor] += 1
        owners = []
        for c in chunks:
            if tensors[c.tensor].numel < MXNET_BIGARRAY_BOUND:
                owners.append((c.tensor * 9973) % num_servers)
            else:
                owners.append(c.part * num_servers // counts[c.tensor])
        return owners


@PLACEMENTS.register("greedy")
class GreedyPlacement(PlacementPolicy):
    """Longest-processing-time first by bytes: biggest chunk to the least-loaded server."""

    name = "greedy"

    def place(
        self, tensors: Sequence[TensorSpec], chunks: Sequence[ChunkSpec], num_servers: int
    ) -> list[int]:
        load = [0] * num_servers
        owners = [0] * len(chunks)
        for c in sorted(chunks, key=lambda c: (-c.nbytes, c.id)):
            server = min(range(num_servers), key=lambda s: (load[s], s))
            owners[c.id] = server
            load[server] += c.nbytes
        return owners


@PLACEMENTS.register("psld")
class PsldPlacement(GreedyPlacement):
    """Starts as ``greedy``; then the coordinator moves chunks live from the servers'
    measured speeds (see :mod:`trimtab._psld`)."""


@PLACEMENTS.register("psld-mxnet")
class PsldFromMxnetPlacement(MxnetPlacement):
    """Starts as ``mxnet`` (MXNet's rule, blind to load); then live rebalancing as
    ``psld``: to see psld repair a skewed assignment while training runs."""


def is_live(placement: str) -> bool:
    """Whether a placement moves chunks live from measured speeds (``psld``, ``psld-*``)."""
    return placement == "psld" or placement.startswith("psld-")
