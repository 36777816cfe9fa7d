"""A worker process's handle on its job: membership, placement, barriers, broadcast.

One :class:`Context` per worker; the public functions (``trimtab.init()`` and friends)
use a default one, and everything takes an explicit context too, so one test process can
hold several workers.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from trimtab.core.chunks import ChunkSpec, PlacementMap, TensorSpec, make_chunks
from trimtab.faults.stragglers import StragglerSpec, WorkerStraggler
from trimtab.protocol.messages import Control, Data
from trimtab.roles.worker.client import Reply, WorkerClient, WorkerConfig, wait
from trimtab.runtime.tensors import as_bytes
from trimtab.transport import Transport

if TYPE_CHECKING:
    from trimtab.frontend.optimizer import DistributedOptimizer

log = logging.getLogger("trimtab")

#: Broadcast buffers are cut into frames no larger than this (large single frames are
#: several times slower through ZeroMQ than a few-MiB frames).
BROADCAST_FRAME_BYTES = 4 << 20


class Context:
    """A worker's view of the job. Methods block and are meant for the training thread.

    Raises (from any method): :class:`~trimtab.JobAborted` if the job ended,
    :class:`~trimtab.NodeTimeout` if a peer did not answer in time.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        local_rank: int = -1,
        transport: Transport | None = None,
        stragglers: Sequence[StragglerSpec] = (),
        compression: str = "none",
    ) -> None:
        self.config = config
        #: The gradient compression optimizers use unless given one (``--compression``).
        self.compression = compression
        self.client = WorkerClient(config, transport)
        self.client.start()
        self.local_rank = self.client.rank if local_rank < 0 else local_rank
        self._placement: PlacementMap | None = None
        self.tensors: list[TensorSpec] = []
        self.chunks: list[ChunkSpec] = []
        self.optimizers: list[DistributedOptimizer] = []
        self.job: dict[str, Any] = {}  # consistency and batching modes, from the map
        self.straggler = WorkerStraggler(stragglers, self.rank)
        self._prev: tuple[int, ...] = ()
        self._cuts: dict[int, int] = {}
        self._bcast_seq = itertools.count()
        self._barrier_seq = itertools.count()
        log.debug("worker %d of %d joined", self.rank, self.size)

    @property
    def placement(self) -> PlacementMap | None:
        """The placement map this worker routes by (None before :meth:`declare`)."""
        return self._placement

    @placement.setter
    def placement(self, value: PlacementMap) -> None:
        self._placement = value
        self.client.map_epoch = value.epoch  # its heartbeats tell the coordinator

    @property
    def rank(self) -> int:
        return self.client.rank

    @property
    def size(self) -> int:
        return self.client.num_workers

    @property
    def timeout_s(self) -> float:
        return self.config.request_timeout_s

    def close(self) -> None:
        """Leave the job (this worker is done). Never raises."""
        for opt in self.optimizers:
            with contextlib.suppress(Exception):  # the job may be over already
                opt.wait_parameters()
            opt._release_arena()
        self.straggler.close()
        self.client.close()

    def call(self, header: dict[str, Any], frames: Iterable[Any] = ()) -> Reply:
        """A blocking request to the coordinator."""
        return wait(self.client.control(header, list(frames)), self.timeout_s)

    def declare(self, tensors: list[TensorSpec], opt: dict[str, Any]) -> PlacementMap:
        """Declare the tensors to train; blocks until every worker declared the same and
        every server holds its chunks. Raises :class:`~trimtab.RemoteError` (code
        ``mismatch``) if workers disagree."""
        reply = self.call(
            {"o": int(Control.DECLARE), "tensors": [t.to_wire() for t in tensors], "opt": opt}
        ).header
        self.tensors = tensors
        self.job = {
            "batching": reply.get("batching", "equal"),
            "report_s": float(reply.get("report_s", 0.0)),
            "consistency": reply.get("consistency", "bsp"),
            "time_servers": bool(reply.get("time_servers", False)),
        }
        self.chunks = make_chunks(tensors, reply["chunk_bytes"])
        placement = PlacementMap(reply["epoch"], tuple(reply["owners"]), tuple(reply["servers"]))
        self.placement = placement
        return placement

    def server_of(self, chunk: int, clock: int | None = None) -> str:
        """The address of the server that owns ``chunk`` (for the push of step ``clock``:
        a chunk that is moving belongs to its previous owner before its cut)."""
        return self.address(self.owner_of(chunk, clock))

    def address(self, server: int) -> str:
        """The address of server ``server`` (an index of the placement map)."""
        assert self.placement is not None
        return self.placement.servers[server]

    def owner_of(self, chunk: int, clock: int | None = None) -> int:
        """The index of the server that owns ``chunk``, as :meth:`server_of`."""
        assert self.placement is not None
        cut = self._cuts.get(chunk)
        if clock is not None and cut is not None and clock < cut:
            return self._prev[chunk]
        return self.placement.owners[chunk]

    def describe(self) -> str:
        """This worker's protocol state, for a hung job's dump (:data:`STACK_SIGNAL`):
        its map, its requests in flight, each optimizer's. Only reads; never blocks."""
        epoch = self.placement.epoch if self.placement else 0
        moving = {c: (self._prev[c], k) for c, k in self._cuts.items()} if self._prev else {}
        lines = [
            f"worker {self.rank}: map epoch {epoch}; chunks moving (from server, at clock): "
            f"{moving or 'none'}; {self.client.describe()}"
        ]
        lines.extend(opt.describe() for opt in self.optimizers)
        return "\n".join(lines)

    def routing_floor(self) -> int:
        """:meth:`WorkerClient.routing_floor`. Never blocks (beyond a short lock)."""
        return self.client.routing_floor()

    def refresh_map(self, epoch: int) -> None:
        """Fetch the placement map of at least ``epoch`` from the coordinator. Blocks
        until the coordinator has published it."""
        if self.placement is not None and self.placement.epoch >= epoch:
            return
        floor = self.routing_floor()
        reply = self.call({"o": int(Control.MAP_GET), "e": epoch, "lo": floor}).header
        self._prev = tuple(reply["prev"])
        self._cuts = {int(c): int(k) for c, k in reply["cuts"].items()}
        self.placement = PlacementMap(
            reply["epoch"], tuple(reply["owners"]), tuple(reply["servers"])
        )
        log.debug("worker %d: placement epoch %d", self.rank, reply["epoch"])

    def _wait_parameters(self) -> None:
        """Write every answer this worker's optimizers are still owed. Blocks."""
        for opt in self.optimizers:
            opt.wait_parameters()

    def barrier(self, name: str | None = None) -> None:
        """Block until every worker reached the barrier of the same name (and this
        worker's parameters hold every update it was sent)."""
        self._wait_parameters()
        label = name if name is not None else f"b{next(self._barrier_seq)}"
        self.call({"o": int(Control.BARRIER), "name": label})

    def server_stats(self) -> list[dict[str, Any]]:
        """Each live server's counters (versions, pushes, errors). Blocks."""
        assert self.placement is not None
        status = self.call({"o": int(Control.STATUS)}).header
        futs = [
            self.client.request(status["servers"][s], {"o": int(Data.STATS)})
            for s in status["live_servers"]
        ]
        return [wait(f, self.timeout_s).header for f in futs]

    def broadcast(self, tensors: Mapping[str, torch.Tensor], root_rank: int) -> None:
        """Overwrite ``tensors`` in place with the root worker's values. Collective:
        every worker calls it with the same names, in the same order."""
        if not 0 <= root_rank < self.size:
            raise ValueError(f"root_rank {root_rank} is not a worker rank (0..{self.size - 1})")
        self._wait_parameters()
        key = f"bcast{next(self._bcast_seq)}"
        names = list(tensors)
        if self.rank == root_rank:
            frames: list[memoryview] = []
            counts = []
            for name in names:
                t = tensors[name].detach().contiguous().cpu()
                raw = as_bytes(t)
                pieces = [
                    raw[i : i + BROADCAST_FRAME_BYTES]
                    for i in range(0, len(raw), BROADCAST_FRAME_BYTES)
                ] or [raw]
                frames.extend(pieces)
                counts.append(len(pieces))
            meta = {"names": names, "frames": counts}
            self.call({"o": int(Control.BCAST_PUT), "key": key, "meta": meta}, frames)
        else:
            reply = self.call({"o": int(Control.BCAST_GET), "key": key})
            meta = reply.header["meta"]
            if meta["names"] != names:
                raise ValueError(
                    f"broadcast from rank {root_rank} carried {meta['names'][:5]}..., this "
                    f"worker asked for {names[:5]}...: call it with the same tensors everywhere"
                )
            it = iter(reply.frames)
            for name, count in zip(names, meta["frames"], strict=True):
                data = bytearray().join(next(it) for _ in range(count))
                dst = tensors[name]
                src = torch.frombuffer(data, dtype=dst.dtype) if data else None
                with torch.no_grad():
                    if src is not None:
                        dst.copy_(src.view(dst.shape))
        for opt in self.optimizers:
            opt._reseed_servers(tensors.values(), root_rank)
