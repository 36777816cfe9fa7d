"""A server's steady state in one function: a dense PUSH under BSP, taken from the
message to its merge and, when it completes the round, the update and the replies.

The general path (``Server._on_data`` -> :meth:`ChunkStore.push` -> ``update`` ->
``ReplicaLink.after_rounds`` -> ``Server._answer`` -> :meth:`Receipts.reply` ->
:meth:`Receipts.value`) reads the header in five layers, each for every case the job
may be in (moves, replicas, shared memory, rows, compression, SSP, traces). Here the
common case is recognised first and served in one pass, with the same checks on what
the peer sent: its credential (the same call), every key's type, the chunk (held
here), the worker, a positive weight, the round (BSP's clock), a second push of the
round, the dtype, the element count and the frame's size before ``frombuffer``.

Anything else, or any check that fails, is left to the general path with nothing
changed (:meth:`SteadyPush.push` returns False): it refuses as it always did, with
the same error. What a push here changes (merge, counters, clocks, the waiting reply,
the round's update and replies) is what the general path changes for it, in the same
order; ``tests/unit/test_steady_push.py`` runs the same pushes through both and
compares values, optimizer state, rounds, counters and the replies' bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.policies.consistency import Bsp
from trimtab.protocol.messages import Header
from trimtab.roles.server.chunk import Reply
from trimtab.roles.server.receipt import Receipts
from trimtab.roles.server.replica import Replicas
from trimtab.roles.server.store import ChunkStore
from trimtab.runtime.credentials import Credentials
from trimtab.runtime.tensors import TORCH_DTYPES
from trimtab.transport import Peer

#: The keys a steady push may carry: anything else (``b``, ``sm``, ``z``, ``g``,
#: ``hp``, ``sr``, a trace's) is the general path's.
STEADY_KEYS = frozenset({"o", "i", "j", "c", "e", "dt", "n", "r", "k", "w", "v", "t", "ak", "vk"})


class SteadyPush:
    """The steady-state push of one server (see the module's text). Not thread-safe:
    the server's loop owns it; nothing here blocks but a send.

    Args:
        store: the server's chunks.
        credentials: checks the push's worker credential.
        receipts: sends the replies (:meth:`Receipts.current`, or the general
            :meth:`Receipts.reply` for any other).
        replicas: the server's replicas: with backups or after a failover, pushes take
            the general path.
        through_lane: whether a peer's messages come over the local lane (counted).
    """

    def __init__(
        self,
        store: ChunkStore,
        credentials: Credentials,
        receipts: Receipts,
        replicas: Replicas,
        through_lane: Callable[[Peer], bool],
    ) -> None:
        self._store = store
        self._worker = credentials.worker
        self._receipts = receipts
        self._replicas = replicas
        self._through_lane = through_lane

    def push(self, peer: Peer, frames: Sequence[memoryview], header: Header) -> bool:
        """Serve ``header`` (a decoded PUSH; ``frames``: the whole message) if it is a
        steady push; return whether it was. False: nothing changed, the general path
        serves it. Raises a FORBIDDEN :class:`ProtocolError` for a bad credential (the
        general path's first check of a push, the same error). Blocks only as a send."""
        store = self._store
        replicas = self._replicas
        if (
            len(frames) != 2
            or store.moves
            or store.trace is not None
            or type(store.consistency) is not Bsp
            or replicas.fence
            or replicas.backup_of
            or not header.keys() <= STEADY_KEYS
        ):
            return False
        rank = self._worker(header)
        get = header.get
        cid = get("c")
        clock = get("k")
        weight: float | None = get("w")
        dtype = get("dt")
        wt = type(weight)
        if not (
            type(cid) is int
            and type(clock) is int
            and (wt is float or wt is int)
            and type(get("e")) is int
            and type(get("v", 0)) is int
            and type(get("vk", 0)) is int
            and type(get("n")) is int
            and type(dtype) is str
        ):
            return False
        chunk = store.chunks.get(cid)
        if chunk is None or weight is None:  # (checked above: for the type checker)
            return False
        spec = chunk.spec
        frame = frames[1]
        if (
            rank not in store.workers
            or weight <= 0
            or clock != chunk.round
            or rank in chunk.arrived
            or chunk.rows is not None
            or dtype != spec.dtype
            or get("n") != spec.numel
            or frame.nbytes != spec.numel * DTYPE_SIZES[dtype]
            or frame.readonly
        ):
            return False
        # Everything is validated: from here on the chunk's state changes, as
        # ChunkStore.push changes it for a dense push under BSP (discount 1).
        grad = torch.frombuffer(frame, dtype=TORCH_DTYPES[dtype], count=spec.numel)
        chunk.pushes += 1
        store.lane_pushes += self._through_lane(peer)
        weight = float(weight)
        chunk.weight_sum += weight
        if not chunk.any_grad and chunk.scale <= 0:
            chunk.scale = chunk.last_sum or weight * len(store.workers)
        alpha = weight / chunk.scale
        merge = chunk.merge
        if chunk.any_grad:
            merge.add_(grad, alpha=alpha)
        elif grad.dtype == merge.dtype:
            torch.mul(grad, alpha, out=merge)
            chunk.any_grad = True
        else:
            merge.copy_(grad).mul_(alpha)
            chunk.any_grad = True
        chunk.arrived.add(rank)
        chunk.last_clock[rank] = clock
        chunk.waiting.append(Reply(peer, header["i"], rank, clock + 1, chunk, None, get("vk", 0)))
        if chunk.arrived.issuperset(store.workers):  # (Bsp.ready, without a generator)
            self.answer(store.update(chunk))
        return True

    def answer(self, replies: Sequence[Reply]) -> None:
        """Send a completed BSP round's replies (of one chunk; no backup to wait for,
        no move): each through :meth:`Receipts.current`. Blocks only as a send."""
        current = self._receipts.current
        for r in replies:
            current(r)
