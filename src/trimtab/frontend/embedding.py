"""``trimtab.nn.Embedding`` and ``trimtab.nn.EmbeddingBag``: torch's modules, with the
table on the servers.

The weight is a server table (:mod:`trimtab.frontend.tables`): a worker never holds it.
A forward reads the batch's unique rows from their chunks' servers (one row PULL per
chunk they reach into), runs torch's own ``embedding`` / ``embedding_bag`` over those
rows, and its backward hands autograd a sparse gradient of the table (the rows read),
which the :class:`~trimtab.DistributedOptimizer` pushes as rows like any sparse
gradient. ``prefetch(ids)`` (Lapse's and AdaPM's *intent*) sends the reads of a coming
batch now; its forward takes them if they are current (a read answered before the last
update of a row's chunk is read again), so the result is the same with or without it.
Not thread-safe: the training thread uses a module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from trimtab.errors import ConfigError, UsageError
from trimtab.frontend.growing import GrowingRows, check_growth
from trimtab.frontend.hotrows import HotRows
from trimtab.frontend.pusher import Pusher
from trimtab.frontend.tables import (
    TableInit,
    linked,
    row_requests,
    rows_from,
    table_parameter,
)
from trimtab.policies.growth import Growth
from trimtab.policies.hotkeys import HotKeys


class _Rows(torch.autograd.Function):
    """The rows read, as a function of the table: the gradient of the rows becomes a
    sparse gradient of the table (rows ``ids``), as torch's sparse embeddings make."""

    @staticmethod
    def forward(
        ctx: Any, weight: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, ordered: bool
    ) -> Any:
        ctx.ids, ctx.shape, ctx.ordered = ids, weight.shape, ordered
        return rows

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        ids, grad = ctx.ids, grad.contiguous()
        kept = ids >= 0  # (a growing table's ids not admitted: their gradient dropped)
        if not bool(kept.all()):
            ids, grad = ids[kept], grad[kept]
        # ``ordered``: the ids are unique and sorted (torch.unique's), so the gradient is
        # coalesced as made and the row push does not sort it again.
        table = torch.sparse_coo_tensor(
            ids.view(1, -1), grad, ctx.shape, check_invariants=False, is_coalesced=ctx.ordered
        )
        return table, None, None, None


class _ServerTable(nn.Module):
    """What both modules share: the weight on the servers, the reads and the prefetch."""

    weight: nn.Parameter

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None,
        max_norm: float | None,
        dtype: torch.dtype | None,
        seed: int,
        hot_rows: int,
        hot_refresh: int,
        growing: Growth | None = None,
    ) -> None:
        super().__init__()
        if max_norm is not None:
            raise ConfigError(
                "max_norm renormalises rows in place on the worker; a table on the servers "
                "cannot: leave max_norm None"
            )
        if padding_idx is not None and not -num_embeddings <= padding_idx < num_embeddings:
            raise ConfigError(f"padding_idx must be within num_embeddings, got {padding_idx}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = None if padding_idx is None else padding_idx % num_embeddings
        init = TableInit(seed=seed, padding_idx=self.padding_idx)
        self._growing = None
        if growing is not None:
            growth = check_growth(growing, num_embeddings, hot_rows, padding_idx)
            self._growing = GrowingRows(growth, (num_embeddings, embedding_dim), init)
        dtype = dtype or torch.get_default_dtype()
        shape = (num_embeddings, embedding_dim)
        hot = HotRows(shape, dtype, HotKeys(size=hot_rows, refresh_steps=hot_refresh))
        self.weight = table_parameter(num_embeddings, embedding_dim, dtype, init, hot)
        self._hot = hot
        self._prefetched: tuple[torch.Tensor, list[Any], list[Any]] | None = None
        #: The next forward's hot set, chosen by the prefetch ((None,): the same set).
        self._chosen: tuple[torch.Tensor | None] | None = None
        #: Rows read (through the forward's own reads, or prefetched and current).
        self.rows_read = 0
        self.rows_prefetched = 0

    def prefetch(self, ids: torch.Tensor, *, hold: bool = False) -> None:
        """Send now the reads of the rows ``ids`` (any shape): the coming forward over
        them takes their answers. Call it once this step's ``step()`` returned (a read
        sent earlier is answered before this step's update and read again). ``hold``:
        keep the reads to go with the next prefetch sent without it (or the first
        wait for a reply), in one message per server: the tables of a model prefetched
        one after the other, the last without ``hold``. Never blocks; raises
        :class:`~trimtab.UsageError` before the optimizer is built."""
        pusher: Pusher = linked(self.weight)
        if self._growing is not None:
            raise UsageError("a growing table reads its ids as they come: call no prefetch")
        unique = torch.unique(ids.detach().cpu())
        hot = self._hot
        if hot.due(ahead=1) and self._chosen is None:
            self._chosen = (hot.choose(),)  # (the forward's new set: its rows read now)
        new = self._chosen[0] if self._chosen is not None else None
        refresh = hot.refresh_due(ahead=1)  # (SSP, ASP: the held rows are read with these)
        if new is not None or refresh or hot.stale:  # (what the forward's _rehold reads)
            unique = self._wanted(unique, hot.ids if new is None else new, new, refresh)[1]
        else:
            unique = unique[~torch.isin(unique, hot.ids)]  # (the hot are here)
        requests = row_requests(self.weight, pusher.chunks_of[self.weight], unique, pusher.epoch)
        sent = pusher.send([(c, h, f) for c, h, f, _ in requests])
        if not hold:
            pusher.flush()
        self._prefetched = unique, requests, sent

    def _rows(self, unique: torch.Tensor) -> torch.Tensor:
        """Rows ``unique`` (sorted) of the table, current: hot ones from the replicas
        here (chosen again when due), the others prefetched where they were, else read
        now. Blocks."""
        p = self.weight
        pusher: Pusher = linked(p)
        if p in pusher.arriving:  # (model=: this step's updates are the rows' values)
            pusher.arrive([p])
        hot = self._hot
        refresh = hot.refresh_due(ahead=1)  # (SSP, ASP: every held row read afresh)
        hot.count(unique)
        chosen, self._chosen = self._chosen, None  # (by the prefetch, which read its rows)
        new = chosen[0] if chosen is not None else hot.choose() if hot.due() else None
        if new is not None or hot.stale or refresh:
            # (SSP, ASP: a new set's rows kept are read again too: their age restarts)
            everything = refresh or (new is not None and hot.period > 0)
            return self._rehold(pusher, unique, new, everything=everything)
        is_hot, held = hot.split(unique)
        if bool(is_hot.all()):
            return held
        out = torch.empty(unique.numel(), *p.shape[1:], dtype=p.dtype)
        out[is_hot] = held
        out[~is_hot] = self._cold(pusher, unique[~is_hot])
        return out

    def _rehold(
        self,
        pusher: Pusher,
        unique: torch.Tensor,
        new: torch.Tensor | None,
        *,
        everything: bool = False,
    ) -> torch.Tensor:
        """:meth:`_rows` where the hot set changes to ``new`` (None: the same set, some
        of whose servers lacked it): the set's rows not held current here are read in
        the same requests as the forward's cold rows (one round trip, not two). Rows
        held stay (every update of them came back); after a stale answer all are read
        again, and ``everything`` (SSP, ASP: the replicas' period is up). Blocks."""
        hot, p = self._hot, self.weight
        ids = hot.ids if new is None else new
        kept, wanted = self._wanted(unique, ids, new, everything)
        values = self._cold(pusher, wanted)
        held = torch.empty(ids.numel(), *p.shape[1:], dtype=p.dtype)
        held[kept] = hot.values[torch.searchsorted(hot.ids, ids[kept])]
        held[~kept] = values[torch.searchsorted(wanted, ids[~kept])]
        hot.hold(ids, held, new_set=new is not None)
        is_hot, mine = hot.split(unique)
        out = torch.empty(unique.numel(), *p.shape[1:], dtype=p.dtype)
        out[is_hot] = mine
        out[~is_hot] = values[torch.searchsorted(wanted, unique[~is_hot])]
        return out

    def _wanted(
        self, unique: torch.Tensor, ids: torch.Tensor, new: torch.Tensor | None, refresh: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Of the hot set ``ids`` (``new``, or None: the held set) which rows stay as held
        (a mask), and the rows a forward over ``unique`` then reads (sorted): the
        others of the set and ``unique``'s cold ones. Every row of the set is read
        after a stale answer, when ``refresh`` is due, and for a new set under SSP and
        ASP (its age restarts). Never blocks."""
        hot = self._hot
        everything = refresh or (new is not None and hot.period > 0)
        kept = torch.zeros(ids.numel(), dtype=torch.bool)
        if not hot.stale and not everything and hot.ids.numel():
            kept = torch.isin(ids, hot.ids)
        cold = unique[~torch.isin(unique, ids)]
        return kept, torch.unique(torch.cat([ids[~kept], cold]))

    def _cold(self, pusher: Pusher, unique: torch.Tensor) -> torch.Tensor:
        """Rows ``unique`` (sorted): those prefetched, if the prefetch is current, from
        its answers, the others read now. Blocks."""
        p = self.weight
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is None:
            self.rows_read += unique.numel()
            return self._pull(unique)
        ids, requests, sent = prefetched
        replies = pusher.wait_all(sent)  # (raises what a read raises, even if unused)
        current = all(
            int(r.header.get("k", 0)) > pusher.rounds.get(c.id, -1)
            for (c, _, _, _), r in zip(requests, replies, strict=True)
        )
        if not current or ids.numel() == 0 or unique.numel() == 0:
            self.rows_read += unique.numel()
            return self._pull(unique)
        at = torch.searchsorted(ids, unique).clamp_(max=ids.numel() - 1)
        covered = ids[at] == unique
        answered = [(c, mine, r) for (c, _, _, mine), r in zip(requests, replies, strict=True)]
        out = rows_from(p, ids, answered)[at]
        n = int(covered.sum())
        self.rows_prefetched += n
        if n < unique.numel():  # (ids the prefetch did not name: read now)
            self.rows_read += unique.numel() - n
            out[~covered] = self._pull(unique[~covered])
        return out

    def _pull(self, unique: torch.Tensor) -> torch.Tensor:
        """Rows ``unique`` (sorted) read from their servers now. Blocks."""
        p = self.weight
        pusher: Pusher = linked(p)
        requests = row_requests(p, pusher.chunks_of[p], unique, pusher.epoch)
        replies = pusher.ask([(c, h, f) for c, h, f, _ in requests])
        answered = [(c, m, r) for (c, _, _, m), r in zip(requests, replies, strict=True)]
        return rows_from(p, unique, answered)

    def growth_report(self) -> dict[str, int]:
        """A growing table's counters (:meth:`GrowingRows.report`: admitted, refused,
        evicted, evicted_for_cap, full, live, dropped). Raises :class:`UsageError` for
        a table that does not grow."""
        if self._growing is None:
            raise UsageError("this table does not grow: build it with growing=Growth(...)")
        return self._growing.report()

    def hot_report(self) -> dict[str, float]:
        """The hot set (rows, version) and the share of row reads it served."""
        return self._hot.report()

    def _read(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        """The rows ``input`` reads, as a tensor of the graph; ``input`` in those rows'
        numbering; the padding row's number there (None: not among them)."""
        unique, local = torch.unique(input.detach().cpu(), return_inverse=True)
        if self._growing is not None:
            return self._read_grown(unique, local.to(input.device), input.device)
        if unique.numel() and (int(unique[0]) < 0 or int(unique[-1]) >= self.num_embeddings):
            raise IndexError(f"index out of range in a table of {self.num_embeddings} rows")
        rows = self._rows(unique).to(input.device)
        if torch.is_grad_enabled() and self.weight.requires_grad:
            rows = _Rows.apply(self.weight, rows, unique, True)  # type: ignore[no-untyped-call]
        padding = None
        if self.padding_idx is not None:
            hit = (unique == self.padding_idx).nonzero()
            padding = int(hit[0]) if hit.numel() else None
        return rows, local.to(input.device), padding

    def _read_grown(
        self, unique: torch.Tensor, local: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """:meth:`_read` of a growing table: ids of any value, mapped to rows by their
        buckets' servers (an id not admitted reads as zeros; its gradient is dropped)."""
        assert self._growing is not None
        p = self.weight
        slots, rows = self._growing.read(linked(p), p, unique)
        rows = rows.to(device)
        if torch.is_grad_enabled() and p.requires_grad:
            self._growing.dropped += int((slots < 0).sum())
            rows = _Rows.apply(p, rows, slots, False)  # type: ignore[no-untyped-call]
        return rows, local, None

    def full_weight(self) -> torch.Tensor:
        """The whole table, read from the servers (for a test or an evaluation: it is
        the table's size). Blocks."""
        return self._pull(torch.arange(self.num_embeddings))


class Embedding(_ServerTable):
    """``torch.nn.Embedding`` whose weight lives on the servers (see the module's
    docstring); ``seed`` chooses its starting values (``N(0, 1)``, as torch's). The
    gradient is always rows (``sparse`` is accepted and ignored): train it with SGD
    (no momentum), Adagrad or SparseAdam. ``hot_rows``: the most rows replicated here
    (NuPS's hot set, chosen every ``hot_refresh`` forwards by access count; 0: every
    read goes to the servers). ``growing``: a :class:`~trimtab.nn.Growth` makes the
    table grow: its ids are any 64-bit values, each mapped to one of the
    ``num_embeddings`` rows on its admission, rows evicted by the rules (docs/sparse.md
    section 5; ``growth_report()`` gives the counters). Raises :class:`ConfigError` for
    ``max_norm``, and for a growing table with hot rows, a padding row or ``max_rows``
    above ``num_embeddings``."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = True,
        *,
        dtype: torch.dtype | None = None,
        seed: int = 0,
        hot_rows: int = 0,
        hot_refresh: int = 10,
        growing: Growth | None = None,
    ) -> None:
        super().__init__(
            num_embeddings,
            embedding_dim,
            padding_idx,
            max_norm,
            dtype,
            seed,
            hot_rows,
            hot_refresh,
            growing,
        )
        self.scale_grad_by_freq = scale_grad_by_freq

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows, local, padding = self._read(input)
        return functional.embedding(
            local, rows, padding, scale_grad_by_freq=self.scale_grad_by_freq
        )


class EmbeddingBag(_ServerTable):
    """``torch.nn.EmbeddingBag`` whose weight lives on the servers (as
    :class:`Embedding`); ``mode`` "mean", "sum" or "max", ``per_sample_weights``,
    ``include_last_offset`` and ``padding_idx`` as torch's."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = True,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        *,
        dtype: torch.dtype | None = None,
        seed: int = 0,
        hot_rows: int = 0,
        hot_refresh: int = 10,
        growing: Growth | None = None,
    ) -> None:
        super().__init__(
            num_embeddings,
            embedding_dim,
            padding_idx,
            max_norm,
            dtype,
            seed,
            hot_rows,
            hot_refresh,
            growing,
        )
        self.scale_grad_by_freq = scale_grad_by_freq
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rows, local, padding = self._read(input)
        return functional.embedding_bag(
            local,
            rows,
            offsets,
            scale_grad_by_freq=self.scale_grad_by_freq,
            mode=self.mode,
            per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset,
            padding_idx=padding,
        )
