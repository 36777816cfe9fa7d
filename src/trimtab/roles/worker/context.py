"""A worker process's handle on its job: membership, placement, barriers, broadcast,
and the gathers under Horovod's collectives.

One :class:`Context` per worker; the public functions (``trimtab.init()`` and friends)
use a default one (``trimtab.frontend.api`` owns it), and everything takes an explicit
context too, so one test process can hold several workers.

What uses the context's routing (the torch optimizer) joins it as a
:class:`ContextMember`: the context drains members before a barrier or a broadcast, lets
them adopt broadcast values and closes them when the worker leaves, without knowing
what they are. Step hooks (:data:`StepHook`) let the edge (``init()``) wire behaviour
into every step, e.g. an emulated slowdown, without the roles knowing fault injection.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from trimtab.core.chunks import ChunkSpec, PlacementMap, TensorSpec, make_chunks
from trimtab.errors import ConfigError, ProtocolError, UsageError
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header, WireHeader
from trimtab.roles.worker.client import WorkerClient, wait
from trimtab.roles.worker.config import WorkerConfig
from trimtab.roles.worker.replies import Reply
from trimtab.roles.worker.terms import JobTerms
from trimtab.runtime.tensors import as_bytes
from trimtab.transport import Frame, Transport
from trimtab.transport.limits import BROADCAST_FRAME_BYTES  # every node's limits allow it

log = logging.getLogger("trimtab")

#: Called by each step of an optimizer on the context, with the step's clock and the
#: seconds it computed (forward and backward, without waits for values); returns the
#: seconds the step is to report as compute (``compute_s`` to leave it). It may block:
#: an emulated straggler sleeps here and returns the longer time. Runs on the training
#: thread; what it raises comes out of ``step()``.
StepHook = Callable[[int, float], float]


@dataclasses.dataclass(frozen=True)
class Table:
    """One optimizer's part of the job (what one :meth:`Context.declare` declared): its
    tensors and their chunks. Chunk ids and each chunk's ``tensor`` are the job's (the
    tables' tensors follow one another), so ``tensor - first`` is the index among this
    table's tensors.

    Attributes:
        index: the table's number, from 0, in declaration order.
        first: the job's index of the table's first tensor.
        tensors: the tensors declared.
        chunks: their chunks, in id order.
        clock: None for a table new to the job; for one the job had already (its
            optimizer built again after ``init()`` following ``shutdown()``), this
            worker's clock of it, from which the optimizer goes on (the servers hold its
            values and state).
        sizes: every rank's batch size of its first step, for a worker that joined a
            running job (elastic), else None.
    """

    index: int
    first: int
    tensors: tuple[TensorSpec, ...]
    chunks: tuple[ChunkSpec, ...]
    clock: int | None = None
    sizes: tuple[int, ...] | None = None

    def chunks_by_tensor(self) -> list[list[ChunkSpec]]:
        """Each tensor's chunks, in the order the tensors were declared. Pure."""
        out: list[list[ChunkSpec]] = [[] for _ in self.tensors]
        for c in self.chunks:
            out[c.tensor - self.first].append(c)
        return out


class Gathered(NamedTuple):
    """A gather's outcome (:meth:`Context.gather`): each worker's ``meta`` and buffers,
    by rank, and the rank whose part arrived last."""

    metas: list[dict[str, Any]]
    frames: list[list[memoryview]]
    last: int


class ContextMember(Protocol):
    """What joins a :class:`Context` (:meth:`Context.join`) to be drained, told of
    broadcasts and closed with it: one table's optimizer, on the training thread."""

    @property
    def table(self) -> int:
        """The member's table (:attr:`Table.index`)."""

    @property
    def clock(self) -> int:
        """Steps the member completed (told to the coordinator when the worker leaves)."""

    def drain(self) -> None:
        """Write every answer this member is still owed. Blocks."""

    def adopt(self, tensors: Iterable[torch.Tensor], root_rank: int) -> None:
        """``tensors`` now hold worker ``root_rank``'s values (a broadcast): make the
        servers and every worker hold them too, for those that are this member's.
        Collective: every worker calls it. Blocks."""

    def close(self) -> None:
        """Release what the member holds (the worker is leaving). Never raises."""

    def describe(self) -> str:
        """Where the member stands, for a hung job's dump. Only reads."""


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
        compression: str = "none",
    ) -> None:
        self.config = config
        #: The gradient compression optimizers use unless given one (``--compression``).
        self.compression = compression
        self.client = WorkerClient(config, transport)
        self.client.start()
        self.local_rank = self.client.rank if local_rank < 0 else local_rank
        self._placement: PlacementMap | None = None
        #: Every table's tensors, and the job's chunk table over all of them.
        self.tensors: list[TensorSpec] = []
        self.chunks: list[ChunkSpec] = []
        #: The tables declared, one per optimizer, in order.
        self.tables: list[Table] = []
        self.members: list[ContextMember] = []
        #: The job's terms, learned at :meth:`declare`.
        self.job = JobTerms()
        #: Run by every step of the optimizers on this context (:meth:`add_step_hook`).
        self.step_hooks: list[StepHook] = []
        self._closers: list[Callable[[], None]] = []
        self._prev: tuple[int, ...] = ()
        self._cuts: dict[int, int] = {}
        self._bcast_seq = itertools.count()
        self._barrier_seq = itertools.count()
        self._gather_seq = itertools.count()
        self._left = False  # leave() released the members; the connection stays
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

    def join(self, member: ContextMember) -> None:
        """Drain, inform and close ``member`` with this context (see
        :class:`ContextMember`). Never blocks."""
        self.members.append(member)

    def add_step_hook(self, hook: StepHook, *, close: Callable[[], None] | None = None) -> None:
        """Run ``hook`` in every step of the optimizers on this context (see
        :data:`StepHook`), in the order added; ``close`` is called when the worker
        leaves (e.g. to stop competing processes). Never blocks; not thread-safe."""
        self.step_hooks.append(hook)
        if close is not None:
            self._closers.append(close)

    def leave(self) -> None:
        """Step out of the job for now (``shutdown()``): write every answer the members
        are owed, release them and the step hooks, and tell the coordinator (LEAVE)
        each table's clock. This worker keeps its rank, and a new context may register
        under it and go on (``init()`` again, :meth:`take_over`). The connection stays
        open, heartbeating (the coordinator ends the job if this process dies), until
        :meth:`close`. Idempotent. Blocks briefly; never raises."""
        if self._left:
            return
        clocks = [0] * len(self.tables)
        for member in self.members:
            if 0 <= member.table < len(clocks):
                clocks[member.table] = member.clock
        self._release()
        self._left = True
        try:
            wait(self.client.control(headers.leave(clocks=clocks)), 10.0)
        except Exception as exc:  # the job may be over already
            log.warning("worker %d could not tell the coordinator it left: %s", self.rank, exc)

    def close(self, *, done: bool = True, failed: str | None = None) -> None:
        """Leave the job for good: release the members (unless :meth:`leave` did) and
        close the connection, telling the coordinator this worker's process ends (DONE)
        if ``done`` (without: a new context took this one's place), or ``failed``, so
        the job ends now. Never raises."""
        if not self._left:
            self._release(drain=failed is None)  # a failed step's answers never come
        self.client.close(done=done, failed=failed)

    def _release(self, *, drain: bool = True) -> None:
        for member in self.members:
            with contextlib.suppress(Exception):  # the job may be over already
                if drain:
                    member.drain()
            member.close()
        for close in self._closers:
            try:
                close()
            except Exception as exc:
                log.warning("worker %d: a step hook did not close: %s", self.rank, exc)

    def take_over(self, old: Context) -> None:
        """Go on from ``old``, the context this worker :meth:`leave`-d (``init()`` after
        ``shutdown()``): unnamed barriers, broadcasts and collectives keep counting from
        where it stopped, so they still match the other workers' whether those
        re-initialised too or not. Never blocks."""
        self._bcast_seq = old._bcast_seq
        self._barrier_seq = old._barrier_seq
        self._gather_seq = old._gather_seq

    def call(self, header: Header | WireHeader, frames: Iterable[Any] = ()) -> Reply:
        """A blocking request to the coordinator (``header``: a builder's of
        :mod:`trimtab.protocol.headers`, or a plain dict)."""
        return wait(self.client.control(header, list(frames)), self.timeout_s)

    def declare(self, tensors: list[TensorSpec], opt: dict[str, Any]) -> Table:
        """Declare the tensors one optimizer trains (``opt``: its class, mode and groups)
        as the job's next table; blocks until every worker declared the same table and
        every server holds its chunks. Each optimizer of a worker declares once, in the
        same order on every worker. Returns the table (its chunks: the job's ids). After
        ``init()`` following ``shutdown()``, a table the job has already is answered at
        once, with this worker's clock of it (:attr:`Table.clock`).

        Raises :class:`~trimtab.RemoteError`: code ``mismatch`` if workers disagree,
        ``bad_state`` if they declare their optimizers in different orders, or declare
        again a table the job has with other tensors or another optimizer;
        :class:`~trimtab.ProtocolError` if the coordinator's map does not hold the
        tables declared so far and this one."""
        index = len(self.tables)
        declared = headers.declare(tensors=[t.to_wire() for t in tensors], opt=opt, table=index)
        reply = headers.read_job_map(self.call(declared).header)
        first = len(self.tensors)
        clock = reply.get("k")
        held = len(reply["tensors"])
        if held < first + len(tensors) or (clock is None and held != first + len(tensors)):
            raise ProtocolError(
                ErrorCode.MALFORMED.value,
                f"the coordinator's map has {held} tensors; this worker "
                f"declared {first} before and {len(tensors)} now",
            )
        self.tensors = [*self.tensors, *tensors]
        self.chunks = make_chunks(self.tensors, reply["chunk_bytes"])
        table = Table(
            index,
            first,
            tuple(tensors),
            tuple(c for c in self.chunks if c.tensor >= first),
            clock,
            tuple(reply["sizes"]) if isinstance(reply.get("sizes"), list) else None,
        )
        self.tables.append(table)
        if index == 0:
            self.job = JobTerms.from_reply(reply)
        if clock is not None:
            # A running job's map: learn the cuts of chunks that moved, too.
            self._fetch_map(reply["epoch"])
        else:
            self.placement = PlacementMap(
                reply["epoch"], tuple(reply["owners"]), tuple(reply["servers"])
            )
        return table

    def server_of(self, chunk: int, clock: int | None = None) -> str:
        """The address of the server that owns ``chunk`` (for the push of step ``clock``:
        a chunk that is moving belongs to its previous owner before its cut)."""
        return self.address(self.owner_of(chunk, clock))

    def address(self, server: int) -> str:
        """The address of server ``server`` (an index of the placement map). Raises
        :class:`UsageError` before :meth:`declare`."""
        return self._map().servers[server]

    def owner_of(self, chunk: int, clock: int | None = None) -> int:
        """The index of the server that owns ``chunk``, as :meth:`server_of`. Raises
        :class:`UsageError` before :meth:`declare`."""
        placement = self._map()
        cut = self._cuts.get(chunk)
        if clock is not None and cut is not None and clock < cut:
            return self._prev[chunk]
        return placement.owners[chunk]

    def routes(self, chunks: Sequence[ChunkSpec], clock: int) -> list[tuple[int, str]]:
        """Each of ``chunks``' owner at ``clock`` and its address: :meth:`owner_of` and
        :meth:`address` for a parameter's chunks in one call (a push's every chunk).
        Raises :class:`UsageError` before :meth:`declare`."""
        placement = self._map()
        owners, servers, cuts, prev = placement.owners, placement.servers, self._cuts, self._prev
        out = []
        for c in chunks:
            cut = cuts.get(c.id)
            owner = prev[c.id] if cut is not None and clock < cut else owners[c.id]
            out.append((owner, servers[owner]))
        return out

    def _map(self) -> PlacementMap:
        if self._placement is None:
            raise UsageError(
                "this worker has no placement map yet: build the DistributedOptimizer "
                "(it declares the model's tensors) before routing to servers"
            )
        return self._placement

    def describe(self) -> str:
        """This worker's protocol state, for a hung job's dump (:data:`STACK_SIGNAL`):
        its map, its requests in flight, each optimizer's. Only reads; never blocks."""
        epoch = self.placement.epoch if self.placement else 0
        moving = {c: (self._prev[c], k) for c, k in self._cuts.items()} if self._prev else {}
        lines = [
            f"worker {self.rank}: map epoch {epoch}; chunks moving (from server, at clock): "
            f"{moving or 'none'}; {self.client.describe()}"
        ]
        lines.extend(member.describe() for member in self.members)
        return "\n".join(lines)

    def routing_floor(self) -> int:
        """:meth:`WorkerClient.routing_floor`. Never blocks (beyond a short lock)."""
        return self.client.routing_floor()

    def refresh_map(self, epoch: int) -> None:
        """Fetch the placement map of at least ``epoch`` from the coordinator. Blocks
        until the coordinator has published it."""
        if self.placement is not None and self.placement.epoch >= epoch:
            return
        self._fetch_map(epoch)

    def _fetch_map(self, epoch: int) -> None:
        """Fetch the map of at least ``epoch`` and its cuts. Blocks."""
        reply = self.call(headers.map_get(epoch=epoch, floor=self.routing_floor()))
        self._adopt(headers.read_map_reply(reply.header))

    def adopt_map(self, reply: headers.MapReplyHeader) -> None:
        """Route by a published map (MAP_NEWS) and its cuts if it is newer than this
        worker's. Never blocks."""
        if self.placement is not None and self.placement.epoch < reply["epoch"]:
            self._adopt(reply)

    def _adopt(self, reply: headers.MapReplyHeader) -> None:
        self._prev = tuple(reply["prev"])
        self._cuts = {int(c): int(k) for c, k in reply["cuts"].items()}
        self.placement = PlacementMap(
            reply["epoch"], tuple(reply["owners"]), tuple(reply["servers"])
        )
        log.debug("worker %d: placement epoch %d", self.rank, reply["epoch"])

    def _drain(self) -> None:  # every answer this worker's members are still owed; blocks
        for member in self.members:
            member.drain()

    def barrier(self, name: str | None = None) -> None:
        """Block until every worker reached the barrier of the same name (and this
        worker's parameters hold every update it was sent)."""
        self._drain()
        label = name if name is not None else f"b{next(self._barrier_seq)}"
        self.call(headers.barrier(name=label))

    def server_stats(self) -> list[dict[str, Any]]:
        """Each live server's counters (versions, pushes, errors). Blocks. Raises
        :class:`UsageError` before :meth:`declare` (no server holds anything yet)."""
        self._map()
        status = headers.read_status_reply(self.call(headers.status_request()).header)
        futs = [
            self.client.request(status["servers"][s], headers.stats_request())
            for s in status["live_servers"]
        ]
        return [wait(f, self.timeout_s).header for f in futs]

    def broadcast(self, tensors: Mapping[str, torch.Tensor], root_rank: int) -> None:
        """Overwrite ``tensors`` in place with the root worker's values. Collective:
        every worker calls it with the same names, in the same order. Blocks.

        Raises :class:`ConfigError` for a ``root_rank`` that is no worker's, and
        :class:`UsageError` if the root sent other names than this worker asked for."""
        if not 0 <= root_rank < self.size:
            raise ConfigError(
                f"root_rank {root_rank} is not a worker rank: pass one of 0..{self.size - 1} "
                "(trimtab.size() workers; rank 0 is the usual root)"
            )
        self._drain()
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
            meta: dict[str, Any] = {"names": names, "frames": counts}
            self.call(headers.bcast_put(key=key, meta=meta), frames)
        else:
            reply = self.call(headers.bcast_get(key=key))
            meta = headers.read_bcast_value(reply.header)["meta"]
            if meta["names"] != names:
                raise UsageError(
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
        for member in self.members:
            member.adopt(tensors.values(), root_rank)

    def gather(
        self, name: str | None, sig: str, meta: dict[str, Any], frames: Sequence[Frame] = ()
    ) -> concurrent.futures.Future[Reply]:
        """Send this worker's part of a collective: ``sig`` must be the same on every
        worker, ``meta`` and ``frames`` are its own (the frames' memory must stay
        unchanged until the future is done). Collectives without a ``name`` are keyed by
        this worker's count of them, so every worker must call them in the same order.
        Returns the future of the reply at once (read it with :meth:`gathered`);
        thread-safe. The reply fails with :class:`~trimtab.RemoteError` (``mismatch``:
        the workers' ``sig`` differ; ``bad_state``: a worker left the job, or this one
        sent ``name`` twice at once)."""
        key = f"@{name}" if name is not None else f"#{next(self._gather_seq)}"
        return self.client.control(headers.gather(key=key, sig=sig, meta=meta), frames)

    def gathered(self, future: concurrent.futures.Future[Reply]) -> Gathered:
        """Wait for a :meth:`gather`'s reply: every worker's part, in rank order. Blocks;
        raises what the reply failed with, or a MALFORMED :class:`~trimtab.ProtocolError`."""
        reply = wait(future, self.timeout_s)
        header = headers.read_gathered(reply.header)
        if sum(header["n"]) != len(reply.frames):
            raise ProtocolError(
                ErrorCode.MALFORMED.value,
                f"GATHERED counts {sum(header['n'])} buffers and carries {len(reply.frames)}",
            )
        frames = iter(reply.frames)
        parts = [[next(frames) for _ in range(n)] for n in header["n"]]
        return Gathered(header["metas"], parts, header["last"])
