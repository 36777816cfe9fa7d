"""An optimizer's requests for its chunks, one at a time: each sent to its chunk's
owner and waited for, sent again to the new owner if the chunk moved meanwhile, and
with the bytes if the server cannot map this worker's shared memory
(:meth:`ChunkRequests._await`). The values outside the step are read and written
this way: a pull, the starting values seeded at declaration or adoption, and any
list of requests a part of the frontend asks (:meth:`ChunkRequests.ask`: optimizer
state, mean gradients, table rows). The step's pushes and their answers, written
back in bulk, are :class:`~trimtab.frontend.pusher.Pusher`'s, which is one of these.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch

from trimtab.core.chunks import ChunkSpec
from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ChunkMoved, RemoteError
from trimtab.frontend.tables import chunk_init, is_table
from trimtab.protocol import headers
from trimtab.protocol.headers import (
    InitHeader,
    PullHeader,
    PushHeader,
    StateGetHeader,
    StateSetHeader,
    ValueHeader,
)
from trimtab.roles.worker.client import wait
from trimtab.roles.worker.context import Context
from trimtab.roles.worker.replies import Reply, SharedMemoryRefused
from trimtab.runtime.tensors import as_bytes, tensor_from
from trimtab.transport.shm import SlotMap

log = logging.getLogger("trimtab")

#: A request whose chunk moved this many times in a row gives up.
MAX_MOVES = 8
SEED_WINDOW = 16 << 20  # the most bytes of starting values in flight while seeding

#: A chunk request :meth:`ChunkRequests._await` may resend: a PUSH, a PULL, an INIT, a
#: STATE_GET or a STATE_SET.
ChunkRequest = PushHeader | PullHeader | InitHeader | StateGetHeader | StateSetHeader


class ChunkRequests:
    """One optimizer's chunk requests, each waited for in turn.

    Args:
        ctx: the worker's context (routing, the client).
        chunks_of: each parameter's chunks, in order (from the context's chunk table).
        slots: the worker's shared memory for these chunks.

    Not thread-safe: the training thread uses it. Waits raise what
    :func:`~trimtab.roles.worker.client.wait` raises.
    """

    def __init__(
        self, ctx: Context, chunks_of: dict[torch.Tensor, list[ChunkSpec]], slots: SlotMap
    ) -> None:
        self._ctx = ctx
        self.chunks_of = chunks_of
        self.slots = slots
        self._versions: dict[int, int] = {}  # chunk id -> version of the value we hold
        # The request being waited for (chunk, request id, clock), for describe().
        self._awaited: tuple[int, int, int | None] | None = None

    @property
    def epoch(self) -> int:
        """The epoch of the placement map requests are routed by (0 before any)."""
        return self._ctx.placement.epoch if self._ctx.placement else 0

    def _await(
        self,
        fut: concurrent.futures.Future[Reply],
        c: ChunkSpec,
        header: ChunkRequest,
        frames: list[Any],
        clock: int | None,
        *,
        sweep: Callable[[ChunkRequest], None] | None = None,
    ) -> Reply:
        """Wait for a chunk request's reply; if the chunk moved, fetch the new map and
        send the request again to the new owner (and call ``sweep`` with it: the step's
        path resends every push still arriving that was answered *moved* too,
        :meth:`~trimtab.frontend.pusher.Pusher._resend_moved`); if the server
        cannot map our shared memory, send it the bytes. Blocks; raises as
        :func:`wait`, and :class:`RemoteError` if the chunk keeps moving."""
        ctx = self._ctx
        for _ in range(MAX_MOVES):
            try:
                self._awaited = (c.id, header["i"], clock)
                return wait(fut, ctx.config.request_timeout_s)  # (ctx.timeout_s: a call)
            except ChunkMoved as moved:
                ctx.refresh_map(moved.epoch)
                header["e"] = self.epoch
                fut = ctx.client.request(ctx.server_of(c.id, clock), header, frames)
                if sweep is not None:
                    sweep(header)
            except SharedMemoryRefused as exc:
                push = cast(PushHeader, header)  # only a push puts a gradient in a slot
                shared = push.pop("sm", None)
                if shared is None:  # we sent bytes: the server is out of protocol
                    raise RemoteError(exc.code, str(exc)) from None
                address = ctx.server_of(c.id, clock)
                log.info("trimtab: %s: %s; sending it bytes from now on", address, exc)
                nbytes = c.numel * DTYPE_SIZES[push["dt"]]
                frames = [self.slots.refused(address, shared[1], nbytes)]
                fut = ctx.client.request(address, push, frames)
        raise RemoteError(
            "moved", f"chunk {c.id} moved {MAX_MOVES} times during one request; giving up"
        )

    def _write(
        self, dst: torch.Tensor, c: ChunkSpec, h: ValueHeader, frames: list[memoryview]
    ) -> None:
        """Write a chunk's VALUE (header ``h``, tensor ``frames``) into ``dst``."""
        self._versions[c.id] = h["v"]
        src = tensor_from(frames[0], h["dt"], h["n"])
        dst.view(-1)[c.offset : c.offset + c.numel].copy_(src)

    # -- values, outside the step ----------------------------------------------------

    def pull(self, params: Iterable[torch.Tensor]) -> None:
        """Replace ``params`` with the servers' current values. Blocks."""
        ctx = self._ctx
        pulls = []
        epoch = self.epoch  # nothing here changes the map before the waits
        for p in params:
            for c in [] if is_table(p) else self.chunks_of[p]:  # (a table stays there)
                header = headers.pull(chunk=c.id, epoch=epoch)
                pulls.append((p, c, header, ctx.client.request(ctx.server_of(c.id), header)))
        with torch.no_grad():
            for p, c, header, f in pulls:
                reply = self._await(f, c, header, [], None)
                # A VALUE, read directly as in arrive().
                self._write(p.data, c, cast(ValueHeader, reply.header), reply.frames)

    def ask(self, requests: list[tuple[ChunkSpec, ChunkRequest, list[Any]]]) -> list[Reply]:
        """Send each ``(chunk, header, frames)`` request to its chunk's owner, then wait
        for every reply, in order (a request whose chunk moved is resent to its new
        owner). Blocks; raises as :meth:`_await`."""
        return self.wait_all(self.send(requests))

    def send(self, requests: list[tuple[ChunkSpec, ChunkRequest, list[Any]]]) -> list[Any]:
        """:meth:`ask`'s first half: send (row PULLs held, to go in one BATCH per
        server at the first wait or :meth:`WorkerClient.flush_held`), return what
        :meth:`wait_all` takes. Never blocks."""
        request, at = self._ctx.client.request, self._ctx.server_of
        return [(request(at(c.id), h, f, held="sr" in h), c, h, f) for c, h, f in requests]

    def flush(self) -> None:
        """Send the row requests held (:meth:`send`'s). Never blocks."""
        self._ctx.client.flush_held()

    def wait_all(self, sent: list[Any]) -> list[Reply]:
        """:meth:`ask`'s second half: every reply, in order. Blocks; raises as ask."""
        return [self._await(fut, c, h, f, None) for fut, c, h, f in sent]

    def seed(self, params: list[torch.Tensor], root_rank: int, *, adoption: bool = False) -> None:
        """Make the servers hold worker ``root_rank``'s values of ``params`` and every
        worker adopt them. Collective (a barrier); blocks. At declaration (not
        ``adoption``) the servers take the seeding root's INITs; later, every worker
        first asks the coordinator (ADOPT), whose grant the root's INITs carry."""
        ctx = self._ctx
        granted = None
        if adoption:
            granted = headers.read_adopt_reply(ctx.call(headers.adopt(root=root_rank)).header)
        if ctx.rank == root_rank:
            sent = []
            for p in params:
                for c in self.chunks_of[p]:
                    header = headers.init(
                        chunk=c.id, epoch=self.epoch, dtype=c.dtype, numel=c.numel
                    )
                    if granted is not None:
                        header["ad"], header["g"] = granted["ad"], granted["g"]
                    if is_table(p):  # its values start on the servers, chunk by chunk
                        frames = [as_bytes(chunk_init(p, c))]
                    else:
                        frames = [as_bytes(p.data.view(-1)[c.offset : c.offset + c.numel])]
                    fut = ctx.client.request(ctx.server_of(c.id), header, frames)
                    sent.append((fut, c, header, frames))
                    while sum(f[0].nbytes for _, _, _, f in sent) > SEED_WINDOW:
                        self._await(*sent.pop(0), None)  # (a table is never made whole)
            for fut, c, header, frames in sent:
                self._await(fut, c, header, frames, None)
        ctx.barrier()
        if ctx.rank != root_rank:
            self.pull(params)
