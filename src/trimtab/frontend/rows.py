"""The worker's row path: a sparse gradient (``nn.Embedding(..., sparse=True)``) pushed
as the rows it touches, and the rows the servers send back.

The sibling of the dense push in :mod:`trimtab.frontend.pusher`: each chunk of the table
gets the ids of this worker's touched rows that reach into it (deduplicated: the
gradient is coalesced) and those rows' elements inside it
(:func:`trimtab.runtime.rows.split`); an untouched chunk gets a push of no rows, so that
its optimizer steps as torch's does for the whole table (SparseAdam's and Adagrad's step
counts). The answer names the rows that changed: their new elements are written into
the parameter (server mode), or their mean gradient becomes the parameter's sparse
``.grad`` (summation mode and a job's first step). Every worker's copy of the table is
then exact, since under BSP every row that changed comes back to every worker.

An optimizer torch refuses a sparse gradient for (Adam, a weight decay with Adagrad) is
refused here with torch's own error (:func:`check_layout`), before anything is sent.
Not thread-safe: the training thread uses it.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec
from trimtab.errors import UsageError
from trimtab.frontend.tables import hot_of, is_table
from trimtab.protocol import headers
from trimtab.protocol.headers import PushHeader, ValueHeader
from trimtab.roles.worker.context import Context
from trimtab.roles.worker.replies import Reply
from trimtab.runtime.rows import assemble, elements, split, width_of
from trimtab.runtime.tensors import TORCH_DTYPES, as_bytes

#: A row push in flight, as the pusher keeps its pushes: its reply's future, its
#: header and frames, the server it went to.
RowSent = tuple[concurrent.futures.Future[Reply], PushHeader, list[Any], int]


def check_layout(optimizer: torch.optim.Optimizer, group: dict[str, Any], sparse: bool) -> None:
    """Raise what ``optimizer``'s class raises for a gradient of this layout (``sparse``
    or dense) with ``group``'s hyperparameters: torch's own exception and message
    (Adam: "Adam does not support sparse gradients, please consider SparseAdam
    instead"), found by one step of the class on a throwaway 2x2 tensor. Also raises
    :class:`UsageError` for SGD with momentum or weight decay on sparse gradients
    (they would change rows no batch touched, which trimtab's row path does not send
    back). Never blocks."""
    cls = type(optimizer)
    sgd = sparse and isinstance(optimizer, torch.optim.SGD)
    if sgd and (group.get("momentum", 0) or group.get("weight_decay", 0)):
        raise UsageError(
            "trimtab applies sparse gradients with SGD without momentum or weight "
            "decay only (both change rows the batch did not touch); use momentum=0 "
            "and weight_decay=0 for the embeddings' param group, or Adagrad or "
            "SparseAdam"
        )
    accepted = inspect.signature(cls.__init__).parameters
    hp = {k: v for k, v in group.items() if k in accepted and k != "params"}
    probe = torch.nn.Parameter(torch.zeros(2, 2))
    try:
        trial = cls([probe], **hp)
    except Exception:  # a class built otherwise: its own step will say
        return
    if sparse:
        probe.grad = torch.sparse_coo_tensor(
            torch.tensor([[0]]), torch.ones(1, 2), (2, 2), check_invariants=False
        )
    else:
        probe.grad = torch.ones(2, 2)
    trial.step()


class RowPath:
    """Pushes sparse gradients as rows and writes the rows answered, for one optimizer's
    chunks (``chunks_of``, the pusher's) with the pusher's record of chunk versions
    (``versions``, shared). Not thread-safe."""

    def __init__(
        self,
        ctx: Context,
        chunks_of: dict[torch.Tensor, list[ChunkSpec]],
        versions: dict[int, int],
    ) -> None:
        self._ctx = ctx
        self._chunks_of = chunks_of
        self._versions = versions
        # Summation mode: each parameter's mean rows as they arrive, chunk by chunk.
        self._pieces: dict[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        #: A table's answered hot rows (ids, rows) per chunk, written at :meth:`finish`.
        self._hot_rows: dict[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        #: Rows and bytes pushed and answered so far (both ways), for reports and tests.
        self.rows_sent = 0
        self.bytes_sent = 0
        self.rows_received = 0

    def push(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        *,
        clock: int,
        weight: float,
        hp: dict[str, Any] | None,
        epoch: int,
        mean_only: bool,
        prescale: float,
    ) -> list[RowSent]:
        """Send the sparse ``grad`` of ``p`` as one row push per chunk of ``p`` (the step
        ``clock``'s, weighing ``weight``), held to go in one BATCH per server with the
        step's other row pushes (:meth:`WorkerClient.flush_held`, at the pusher's
        ``seal`` or the first wait). Returns the pushes in flight, in chunk order.
        Never waits for answers."""
        ctx = self._ctx
        chunks = self._chunks_of[p]
        width = width_of(tuple(p.shape))
        g = grad.detach()
        if g.device.type != "cpu":
            g = g.cpu()
        if prescale != 1.0:
            g = g / prescale
        parts = split(g, [(width, c.offset, c.numel) for c in chunks])
        hot = hot_of(p)
        out: list[RowSent] = []
        for c, (ids, values) in zip(chunks, parts, strict=True):
            values = values.to(TORCH_DTYPES[c.dtype])
            header = headers.push(
                chunk=c.id,
                epoch=epoch,
                dtype=c.dtype,
                numel=values.numel(),
                rank=ctx.rank,
                clock=clock,
                weight=weight,
                version=self._versions.get(c.id, 0),
                hp=hp,
                mean_only=mean_only,
            )
            header["sr"] = ids.numel()
            frames: list[Any] = [as_bytes(ids), as_bytes(values)] if ids.numel() else []
            if hot is not None:  # a server table: answer my hot rows only
                header["hf"] = hot.version
                if hot.unsent is None or c.id in hot.unsent:
                    mine = hot.in_chunk(width, c.offset, c.numel)
                    header["hs"] = mine.numel()
                    if mine.numel():
                        frames.append(as_bytes(mine))
            nbytes = sum(f.nbytes for f in frames)
            self.rows_sent += ids.numel()
            self.bytes_sent += nbytes
            owner = ctx.owner_of(c.id, clock)
            request = ctx.client.request(ctx.address(owner), header, frames, held=True)
            out.append((request, header, frames, owner))
        if hot is not None:
            hot.unsent = set()
        return out

    def take(
        self, p: torch.Tensor, c: ChunkSpec, h: ValueHeader, frames: list[memoryview], *, grad: bool
    ) -> None:
        """Write a row VALUE of chunk ``c`` of ``p``: its rows' new elements into ``p``,
        or (``grad``) keep their mean gradient for :meth:`finish`. Raises
        :class:`UsageError` for a reply that does not add up (a server out of protocol)."""
        self._versions[c.id] = h["v"]
        hot = hot_of(p)
        if "sr" not in h:  # a table no worker read this step: its whole chunk, current
            if hot is not None and frames and not h.get("z"):
                values = torch.frombuffer(bytearray(frames[0]), dtype=TORCH_DTYPES[h["dt"]])
                hot.write(torch.arange(c.offset, c.offset + values.numel()), values)
            return
        count = int(h.get("sr", 0))
        if hot is not None and h.get("hv") != hot.version:
            hot.stale.add(c.id)  # its server lacks our hot set: read it again, resend it
        if not count:
            if grad:
                self._pieces.setdefault(p, [])
            return
        if len(frames) != 2 or frames[0].nbytes != 8 * count:
            raise UsageError(f"chunk {c.id}: a row reply of {count} rows is malformed")
        ids = torch.frombuffer(bytearray(frames[0]), dtype=torch.int64)
        width = width_of(tuple(p.shape))
        values = torch.frombuffer(bytearray(frames[1]), dtype=TORCH_DTYPES[h["dt"]])
        whole = c.offset % width == 0 and c.numel % width == 0  # (no row cut by the chunk)
        if hot is not None and not grad and whole:  # a table's hot rows, whole
            if values.numel() != count * width:
                raise UsageError(f"chunk {c.id}: {count} rows answered with {values.numel()}")
            self.rows_received += count
            # (written at finish, the table's chunks at once: one search, not one a chunk)
            self._hot_rows.setdefault(p, []).append((ids, values.view(count, width)))
            return
        positions = elements(ids, width, c.offset, c.numel)
        if values.numel() != positions.numel():
            raise UsageError(f"chunk {c.id}: {count} rows answered with {values.numel()} elements")
        self.rows_received += count
        if grad:
            self._pieces.setdefault(p, []).append((positions + c.offset, values))
        elif hot is not None:  # a table: the rows it holds follow the update
            hot.write(positions + c.offset, values)
        elif not is_table(p):
            at = (positions + c.offset).to(p.device)
            p.data.view(-1)[at] = values.to(device=p.device, dtype=p.dtype)

    def finish(self, p: torch.Tensor) -> None:
        """After every chunk of ``p`` was taken: in summation mode, ``p.grad`` := the
        mean gradient of its rows (sparse, laid out as torch's embeddings make it)."""
        held = self._hot_rows.pop(p, None)
        if held:
            _write_held(hot_of(p), held)
        pieces = self._pieces.pop(p, None)
        if pieces is not None:
            p.grad = assemble(tuple(p.shape), pieces, p.dtype).to(p.device)


def _write_held(hot: Any, held: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Write a step's answered hot rows of one table, taken chunk by chunk (so their ids
    increase), in one pass; pieces left by an arrival cut short (ids not increasing
    then) are written one by one, in the order they came. Never blocks."""
    if len(held) == 1:
        hot.write_rows(*held[0])
        return
    ids = torch.cat([i for i, _ in held])
    if bool((ids[1:] > ids[:-1]).all()):
        hot.write_rows(ids, torch.cat([r for _, r in held]))
        return
    for piece in held:
        hot.write_rows(*piece)
