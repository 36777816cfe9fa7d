"""A chunk a server holds (its value, optimizer and the round being aggregated) and the
replies its pushes wait for. Not thread-safe: the server's loop owns them."""

from __future__ import annotations

from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec
from trimtab.errors import ProtocolError
from trimtab.protocol.messages import ErrorCode
from trimtab.roles.server.optim import ChunkOptimizer
from trimtab.roles.server.slots import Slot
from trimtab.runtime.tensors import TORCH_DTYPES, as_bytes
from trimtab.transport import Peer

#: What a push that completes nothing returns: no reply to send.
NO_REPLIES: tuple[Reply, ...] = ()


class Chunk:
    """A chunk this server holds (OWNED or LEAVING), with its aggregation state for the
    current round. Not thread-safe: the server's loop owns it."""

    def __init__(self, spec: ChunkSpec, opt: tuple[str, dict[str, Any]] | None) -> None:
        self.spec = spec
        dtype = TORCH_DTYPES[spec.dtype]
        self.value = torch.zeros(spec.numel, dtype=dtype)
        # Half-precision gradients are summed in float32, as torch's AMP would.
        merge_dtype = torch.float32 if spec.dtype in ("float16", "bfloat16") else dtype
        self.merge = torch.empty(spec.numel, dtype=merge_dtype)
        # Byte views of both buffers, made once: replies send them without copying
        # (both are only ever updated in place).
        self.value_bytes = as_bytes(self.value)
        self.merge_bytes = as_bytes(self.merge)
        # Server mode under BSP: the mean gradient the last round applied, kept for a
        # worker that reads it (a PULL with ``gm``: Horovod's ``.grad`` after step()),
        # in the buffer the round before merged into; the next round merges into the
        # other. Made at the first such round. ``mean_round``: whose mean (-1: none).
        self.last_mean: torch.Tensor | None = None
        self.last_mean_bytes = memoryview(b"")
        self.mean_round = -1
        self.mean_any = False  # whether any worker had a gradient in that round
        self.optimizer = ChunkOptimizer(opt[0], self.value, opt[1]) if opt else None
        self.version = 0
        self.round = 0
        self.weight_sum = 0.0
        self.scale = 0.0  # what each arrival of this round is divided by as it is merged
        self.last_sum = 0.0  # the previous round's sum of weights (synchronous modes)
        self.any_grad = False
        #: The round's rows (a sparse gradient): each push's (chunk positions, values
        #: scaled as merged); None while the round has none (roles/server/rows.py).
        self.rows: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        #: A table's hot rows each worker holds (rank -> (version, ids)): its pushes'
        #: answers carry those of the changed rows only (see frontend/hotrows.py).
        self.hot: dict[int, tuple[int, torch.Tensor]] = {}
        #: Asynchronous modes: the rows of each worker's hot set changed since its last
        #: answer (a new set: all of it), which its next answer carries (rank -> ids).
        self.hot_changed: dict[int, torch.Tensor] = {}
        self.mean_only = False  # this round answers the mean gradient, applies nothing
        self.arrived: set[int] = set()
        self.waiting: list[Reply] = []
        self.held: list[Reply] = []  # replies the consistency policy holds back
        self.last_clock: dict[int, int] = {}
        self.last_weight: dict[int, float] = {}
        self.pushes = 0
        self.dropped = 0
        self.discounted = 0
        self.seeded = False  # an INIT set its value (one is taken, before round 0 ends)
        self.adopted = 0  # the last adoption (ADOPT) whose INIT set its value


def keep_mean(chunk: Chunk) -> None:
    """Keep the mean gradient the chunk's round just applied (in ``chunk.merge``) as
    ``chunk.last_mean`` of that round, and give the next round the other buffer to merge
    into: no copy. Never blocks."""
    spare, spare_bytes = chunk.last_mean, chunk.last_mean_bytes
    if spare is None:
        spare = torch.empty_like(chunk.merge)
        spare_bytes = as_bytes(spare)
    chunk.last_mean, chunk.last_mean_bytes = chunk.merge, chunk.merge_bytes
    chunk.merge, chunk.merge_bytes = spare, spare_bytes
    chunk.mean_round, chunk.mean_any = chunk.round, True


def mean_of(chunk: Chunk, round_: int) -> torch.Tensor | None:
    """The mean gradient round ``round_`` of ``chunk`` applied (None: no worker had a
    gradient). Raises BAD_STATE :class:`ProtocolError` where this server does not hold
    it (a later round applied since, the chunk moved here or was restored, the job runs
    in summation mode or asynchronously). Never blocks."""
    if round_ < 0 or round_ != chunk.mean_round:
        raise ProtocolError(
            ErrorCode.BAD_STATE.value,
            f"chunk {chunk.spec.id}: the mean gradient of round {round_} is not held here "
            f"(the last kept: {chunk.mean_round}; -1: none)",
        )
    return chunk.last_mean if chunk.mean_any else None


class Reply:
    """A push waiting for its reply, and, once the store releases it, the reply to send:
    a VALUE of ``chunk`` carrying ``value`` (None: no gradient anywhere, ``z``), the
    chunk's version and ``round``, into ``slot`` when the push came through shared
    memory; ``window``: the value bytes the worker takes in flight (its push's ``vk``; 0:
    no bound); ``rows``: the row ids of a row reply (``value`` then holds their
    elements). One per push. Not thread-safe."""

    __slots__ = (
        "chunk",
        "clock_after",
        "peer",
        "rank",
        "rid",
        "round",
        "rows",
        "slot",
        "value",
        "window",
    )

    def __init__(
        self,
        peer: Peer,
        rid: int,
        rank: int,
        clock_after: int,
        chunk: Chunk,
        slot: Slot | None,
        window: int = 0,
    ) -> None:
        self.window = window
        self.peer = peer
        self.rid = rid
        self.rank = rank
        self.clock_after = clock_after
        self.chunk = chunk
        self.slot = slot
        self.value: torch.Tensor | None = None
        #: A row reply: the ids of the rows whose elements ``value`` holds (in order).
        self.rows: torch.Tensor | None = None
        self.round = 0
