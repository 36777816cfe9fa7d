"""Placement policies: which server owns each chunk at the start of a job.

Pure: a policy maps a chunk table (:mod:`trimtab.core.chunks`) and a server count to
owners. Live moves after the start are :mod:`trimtab.policies.psld`'s.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from trimtab.core.chunks import ChunkSpec, TensorSpec
from trimtab.core.registry import Registry


class PlacementPolicy(abc.ABC):
    """Decides the initial owner of every chunk. Pure: no I/O, no clock."""

    name: ClassVar[str]
    #: True when the coordinator then moves chunks live from the servers' measured
    #: speeds (PSLD, :mod:`trimtab.policies.psld`): workers time each server, report
    #: every step, and the job must run ``bsp`` (chunks move at a step boundary).
    live: ClassVar[bool] = False

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
    measured speeds (see :mod:`trimtab.policies.psld`)."""

    name = "psld"
    live = True


@PLACEMENTS.register("psld-mxnet")
class PsldFromMxnetPlacement(MxnetPlacement):
    """Starts as ``mxnet`` (MXNet's rule, blind to load); then live rebalancing as
    ``psld``: to see psld repair a skewed assignment while training runs."""

    name = "psld-mxnet"
    live = True


def is_live(placement: str) -> bool:
    """Whether the placement named ``placement`` moves chunks live (its policy's
    :attr:`~PlacementPolicy.live`); False for a name no policy has (the configs refuse
    it with their own message). Never raises."""
    return placement in PLACEMENTS.names() and PLACEMENTS.create(placement).live
