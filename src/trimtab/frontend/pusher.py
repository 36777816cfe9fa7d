"""The data path of one optimizer's step: its chunks' pushes, their answers, and the
values.

A :class:`Pusher` holds the chunk table of an optimizer's parameters and moves them:
:meth:`Pusher.push` sends a parameter's gradient, chunk by chunk, to each chunk's owner
(through the worker's shared memory where the server shares it, else inline);
:meth:`Pusher.arrive` waits for the answers and writes them back, resending a push whose
chunk moved meanwhile. Each chunk's work is one loop body of one function, with no object
made per chunk beyond its header and future: the per-chunk hot path (``bench datapath``).
Requests outside the step (pulls, seeding, state) and the wait that resends a moved
request are :class:`~trimtab.frontend.requests.ChunkRequests`', which a Pusher is.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec
from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ChunkMoved, RemoteError
from trimtab.frontend.compression import Compressor
from trimtab.frontend.marks import marked, marking
from trimtab.frontend.pushdump import unanswered
from trimtab.frontend.requests import ChunkRequest, ChunkRequests
from trimtab.frontend.rows import RowPath
from trimtab.frontend.tables import is_table
from trimtab.protocol import headers
from trimtab.protocol.headers import PushHeader, ValueHeader
from trimtab.protocol.messages import ErrorCode, inline
from trimtab.roles.worker.context import Context
from trimtab.roles.worker.replies import FINISHED, DataFuture, Reply
from trimtab.runtime.tensors import as_bytes, wire_dtype
from trimtab.transport.shm import SlotMap

#: Values of chunks up to this size are written into the parameter as bytes (a slice of
#: a byte view kept per parameter: about 1 us) rather than through a torch slice and
#: copy_ (about 13 us of dispatch here); above it torch's copy is the faster (4 MiB:
#: 99 us against 127).
BYTE_WRITE_MAX = 64 * 1024

#: A chunk's push in flight: its reply's future, its header and frames (kept to resend
#: it if the chunk moved) and the server it was sent to (-1 once resent: no traffic).
Sent = tuple[concurrent.futures.Future[Reply], PushHeader, list[Any], int]


class Pusher(ChunkRequests):
    """Pushes one optimizer's gradients and writes back what the servers answer.

    Args:
        ctx: the worker's context (routing, the client).
        chunks_of: each parameter's chunks, in order (from the context's chunk table).
        compression: the wire format of pushed gradients.
        summation: whether answers are mean gradients (written into ``.grad``) rather
            than updated values (written into the parameter); :attr:`summation` may
            change between steps.
        slots: the worker's shared memory for these chunks.
        timed: whether each server's traffic is timed (:meth:`take_traffic`).
        prescale: what each gradient is divided by before it is pushed
            (``gradient_predivide_factor``).

    Not thread-safe: the training thread (its autograd hooks included) uses it. Waits
    raise what :func:`~trimtab.roles.worker.client.wait` raises.
    """

    def __init__(
        self,
        ctx: Context,
        chunks_of: dict[torch.Tensor, list[ChunkSpec]],
        compression: Compressor,
        *,
        summation: bool,
        slots: SlotMap,
        timed: bool,
        prescale: float = 1.0,
    ) -> None:
        super().__init__(ctx, chunks_of, slots)
        self._compression = compression
        #: Whether answers are mean gradients (into ``.grad``), not updated values.
        self.summation = summation
        #: Whether pushes ask the servers for the mean gradient only, with no update
        #: (``g``): a server-mode job's first step, or one switched to summation.
        self.mean_only = False
        self._prescale = prescale
        self.timed = timed
        #: Chunk id -> the round the value we hold came of (server mode).
        self.rounds: dict[int, int] = {}
        # One reused wire buffer per parameter whose gradients are narrowed for the push.
        self._wire: dict[torch.Tensor, torch.Tensor] = {}
        # A byte view of each parameter's memory, with the address it was made for.
        self._bytes_of: dict[torch.Tensor, tuple[int, memoryview]] = {}
        #: This step's pushes, by parameter.
        self.inflight: dict[torch.Tensor, list[Sent]] = {}
        #: Sent, answers not yet written: parameter -> (its requests, their clock).
        self.arriving: dict[torch.Tensor, tuple[list[Sent], int]] = {}
        #: Seconds spent waiting for answers since the optimizer last reset it.
        self.arrive_s = 0.0
        # This step's traffic per server: [first push sent, last reply read, bytes both
        # ways], for PSLD's worker-observed speeds (see reports.spans_of_step).
        self._traffic: dict[int, list[float]] = {}
        # The servers that answered a push of this step *moved*: no figure this step.
        self._turned_away: set[int] = set()
        #: Sparse gradients: pushed as rows, answered with the rows that changed.
        self.rows = RowPath(ctx, chunks_of, self._versions)
        # The pushes whose answers arrive() is writing now, with their clock.
        self._current: tuple[list[Sent], int] | None = None

    def take_traffic(self) -> dict[int, list[float]]:
        """This step's traffic per server (``server -> [first push sent, last reply
        read, bytes both ways]``; empty unless :attr:`timed`); start the next step's.

        A server that answered a push of the step *moved* is left out: the pushes it
        turned away crossed its link within the span, and it did none of their work,
        so neither counting their bytes nor leaving them out gives its speed (in: a 20
        MB/s server relieved of chunks read 56; out: a server cut at the round under
        way, answering 6 of its 8 chunks' pushes moved, read a third of its speed on
        issue 38's bed, and PSLD moved more chunks off it). Never blocks."""
        traffic, self._traffic = self._traffic, {}
        for server in self._turned_away:
            traffic.pop(server, None)
        self._turned_away = set()
        return traffic

    # -- pushes ----------------------------------------------------------------------

    @marking("trimtab.push")  # (in a user's torch profile)
    def push(
        self,
        p: torch.Tensor,
        grad: torch.Tensor | None,
        clock: int,
        weight: float,
        hp: dict[str, Any] | None,
    ) -> None:
        """Send ``grad`` (None: this worker has no gradient for ``p`` this step) as the
        push of step ``clock``, weighing ``weight``, with the changed hyperparameters
        ``hp`` of ``p``'s group (None if unchanged). Does not wait for answers."""
        ctx = self._ctx
        flat = None
        if grad is not None:
            flat = grad.detach().contiguous().view(-1)
            if self._prescale != 1.0:  # (a new tensor: the user's gradient stays)
                flat = flat / self._prescale
            wire = self._compression.wire_dtype(flat.dtype)
            if wire != flat.dtype:
                # Narrowed into a buffer kept for this parameter: its previous push was
                # answered (in synchronize) before this one, so nothing still reads it.
                buf = self._wire.get(p)
                if buf is None:
                    buf = self._wire[p] = torch.empty(flat.numel(), dtype=wire)
                buf.copy_(flat)
                flat = buf
            elif flat.device.type != "cpu":
                flat = flat.cpu()
        futs = []
        sent = time.perf_counter()
        raw, size, dt = None, 0, ""
        if flat is not None:
            raw = as_bytes(flat)  # sliced per chunk below, without copying
            size, dt = flat.element_size(), wire_dtype(flat.dtype)
        slots = self.slots.slots
        # The same for every chunk: nothing in the loop changes the map or the rank.
        epoch, rank, versions, empty = self.epoch, ctx.rank, self._versions, raw is None
        build, mean_only, trace = headers.push, self.mean_only, ctx.client.trace
        request, chunks = ctx.client.request, self.chunks_of[p]
        # Each chunk's owner and its address, for the whole parameter in one call.
        for c, (owner, address) in zip(chunks, ctx.routes(chunks, clock), strict=True):
            header = build(
                chunk=c.id,
                epoch=epoch,
                dtype=c.dtype if empty else dt,
                numel=c.numel,
                rank=rank,
                clock=clock,
                weight=weight,
                version=versions.get(c.id, 0),
                hp=hp,
                empty=empty,
                mean_only=mean_only,
            )
            nbytes = 0
            frames: list[memoryview] = []
            if raw is not None:
                nbytes = c.numel * size
                data = raw[c.offset * size : c.offset * size + nbytes]
                slot = slots.get(c.id)
                shared = None if slot is None else self.slots.write(slot, address, data)
                if shared is not None:
                    header["sm"] = shared
                else:
                    frames = inline(header, data)
            if trace is not None:  # (stamped before it leaves: its merge comes later)
                trace.mark("push", c.id, clock, rank)
            futs.append((request(address, header, frames), header, frames, owner))
            if self.timed:
                traffic = self._traffic.get(owner)
                if traffic is None:
                    self._traffic[owner] = [sent, sent, nbytes]
                else:
                    traffic[2] += nbytes
        self.inflight[p] = futs

    def push_rows(
        self, p: torch.Tensor, grad: torch.Tensor, clock: int, weight: float, hp: Any
    ) -> None:
        """:meth:`push` for a sparse ``grad``: the rows it touches (:mod:`.rows`)."""
        self.inflight[p] = self.rows.push(
            p,
            grad,
            clock=clock,
            weight=weight,
            hp=hp,
            epoch=self.epoch,
            mean_only=self.mean_only,
            prescale=self._prescale,
        )

    def seal(self, clock: int) -> None:
        """The step's pushes are all sent (the row pushes held, in one BATCH per
        server): their answers are now arriving (for clock ``clock``). Never blocks."""
        self._ctx.client.flush_held()
        for p, futs in self.inflight.items():
            self.arriving[p] = (futs, clock)
        self.inflight.clear()

    # -- answers ---------------------------------------------------------------------

    def drain(self) -> None:
        """Write every answer still owed (the steps taken so far). Blocks."""
        self.arrive(list(self.arriving))

    def arrive(self, params: list[torch.Tensor]) -> None:
        """Wait for the answers to ``params``' pushes (those arriving) and write them:
        values into the parameters, or mean gradients into their ``.grad``. Blocks."""
        started, trace = time.perf_counter(), self._ctx.client.trace
        drive, timeout_s = self._ctx.client.drive, self._ctx.config.request_timeout_s
        with torch.no_grad(), self._ctx.client.receiving(), marked("trimtab.wait"):
            for p in params:
                sent = self.arriving.pop(p, None)
                if sent is None:
                    continue
                futs, clock = sent
                self._current = sent  # (swept by _resend_moved, as self.arriving is)
                # The same for every chunk of p (nothing below replaces p.data or
                # changes summation): whether its answers are rows, and for values,
                # p's bytes where small chunks are written (_write_value, inlined).
                table, summation = is_table(p), self.summation
                item = p.element_size()
                bytes_of = None if table or summation else self._byte_view(p)
                versions, rounds = self._versions, self.rounds
                sweep = self._resend_moved
                reply: Reply
                for c, (f, header, frames, owner) in zip(self.chunks_of[p], futs, strict=True):
                    # A push answered by the server it was sent to, with a value, read
                    # here without _await, wait and result (a call each a chunk): the
                    # sockets driven in this turn (receiving(), above) until its future
                    # is done. Anything else (moved, shared memory refused, an error,
                    # no answer in time) is _await's, as before.
                    if type(f) is DataFuture:
                        if f._state != FINISHED:
                            self._awaited = (c.id, header["i"], clock)
                            drive(f, timeout_s, turn_held=True)
                        answered = f._state == FINISHED and f._exception is None
                    else:
                        answered = False
                    if answered:
                        reply = f._result  # type: ignore[assignment]  # (set with it)
                    else:
                        reply = self._await(f, c, header, frames, clock, sweep=sweep)
                        answered = f.exception() is None
                    if trace is not None:  # (read after its server sent it)
                        trace.mark("value", c.id, clock, self._ctx.rank)
                    # A VALUE (its keys: ValueHeader), read directly and unchecked:
                    # read_value would add a call and its checks per chunk. The cast
                    # checks nothing; h and got stand for reply.header and reply.frames.
                    h: ValueHeader = reply.header  # type: ignore[assignment]
                    got = reply.frames
                    if h.get("sm"):
                        nbytes = int(h.get("n", 0)) * DTYPE_SIZES.get(str(h.get("dt")), 0)
                        view = self.slots.value(c.id, nbytes)
                        if view is None:
                            raise RemoteError(
                                ErrorCode.MALFORMED.value,
                                f"chunk {c.id}: a shared-memory reply with no slot",
                            )
                        got = [view]
                    traffic = self._traffic.get(owner) if self.timed else None
                    if traffic is not None and answered:
                        # Answered by the server it was sent to (not resent after a
                        # move): the last reply read off the socket closes its span.
                        traffic[1] = max(traffic[1], reply.at)
                        traffic[2] += got[0].nbytes if got else 0
                    elif traffic is not None:
                        # Moved and resent: the server it was sent to only said so
                        # (no figure for it this step: take_traffic).
                        self._turned_away.add(owner)
                    if "sr" in h or table:  # rows
                        self.rows.take(p, c, h, got, grad=summation)
                        rounds[c.id] = h["k"]
                    elif not summation:
                        # Small chunks of a CPU parameter as bytes; the rest as _write.
                        size = c.numel * item
                        if (
                            bytes_of is not None
                            and got
                            and size <= BYTE_WRITE_MAX
                            and got[0].nbytes == size
                            and h.get("dt") == c.dtype
                        ):
                            versions[c.id] = h["v"]
                            at = c.offset * item
                            bytes_of[at : at + size] = got[0]
                        else:
                            self._write(p.data, c, h, got)
                        rounds[c.id] = h["k"]
                    elif not h.get("z"):
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                        self._write(p.grad, c, h, got)
                self.rows.finish(p)
        self._current = None
        self.arrive_s += time.perf_counter() - started

    def _resend_moved(self, resent: ChunkRequest) -> None:
        """Resend at once, by the map just refreshed, every push still arriving that was
        already answered *moved* (by a map no newer than this one), but ``resent``
        (the one :meth:`_await` sent again itself). Without it each was
        resent only when its turn came to be awaited, after the previous one's value:
        a migration of every chunk cost the step one round trip per chunk, in a row.
        The server that answered it gets no figure this step (:meth:`take_traffic`).
        Never blocks."""
        ctx = self._ctx
        batches = [(futs, clock, 0) for futs, clock in self.arriving.values()]
        if self._current is not None:
            # Those before ``resent`` were answered (their tuples keep the first future).
            futs, clock = self._current
            at = next((i for i, sent in enumerate(futs) if sent[1] is resent), len(futs))
            batches.append((futs, clock, at + 1))
        for futs, clock, start in batches:
            for i in range(start, len(futs)):
                f, header, frames, owner = futs[i]
                if not f.done():
                    continue
                gone = f.exception()
                if not isinstance(gone, ChunkMoved) or gone.epoch > self.epoch:
                    continue
                header["e"] = self.epoch
                again = ctx.client.request(ctx.server_of(header["c"], clock), header, frames)
                if self.timed and owner in self._traffic:
                    self._turned_away.add(owner)  # (no figure for it this step)
                futs[i] = (again, header, frames, -1)  # -1: no server's traffic

    def _byte_view(self, p: torch.Tensor) -> memoryview | None:
        """A byte view of ``p``'s memory, kept while ``p.data`` stays the same (a chunk's
        new value up to :data:`BYTE_WRITE_MAX` is written into it by :meth:`arrive`);
        None for a parameter not on the CPU or not contiguous."""
        if p.device.type != "cpu":
            return None
        ptr = p.data_ptr()
        cached = self._bytes_of.get(p)
        if cached is None or cached[0] != ptr:  # first write, or p.data was replaced
            if not p.is_contiguous():
                return None
            cached = self._bytes_of[p] = (ptr, as_bytes(p.data))
        return cached[1]

    def describe(self) -> str:
        """The chunk requests not yet answered and the last one waited for, for a hung
        job's dump (:func:`~trimtab.frontend.pushdump.unanswered`). Never blocks."""
        return unanswered(self.inflight, self.arriving, self._awaited, self._ctx)

    def close(self) -> None:
        """Release the shared memory (the worker is leaving). Idempotent; never raises."""
        self.slots.close()
