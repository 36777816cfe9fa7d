"""A worker's replicas of a server table's hot rows (NuPS): exact under BSP, within the
staleness bound under SSP and ASP.

The worker counts the rows its forwards read; every ``refresh_steps`` forwards the pure
policy (:func:`trimtab.policies.hotkeys.choose_hot`) picks the hot set, whose rows are
read once (after the last step's update: current) and held here. Each push of the table
tells its chunk's server the hot set's version (``hf``), and the set itself when it
changed (``hs``); the server answers each push with the rows of that set the round
changed, so the replicas follow every update. A server that answers with another
version (the chunk moved, a backup took over, the job resumed) lacks the set: the rows
of its chunks are read again and the set sent again.

Under SSP and ASP each push is an update of its own, and its answer carries the rows of
the worker's hot set that changed since its last answer, by any worker's update (the
server keeps them per worker: roles/server/rows.py's ``follow_hot``), as of the
answer's round. So the replicas follow every update as the dense parameters do, within
SSP's bound, with no read of their own (before 2026-11-29's ninth session they were read
afresh every ``staleness`` forwards). Not thread-safe.
"""

from __future__ import annotations

import torch

from trimtab.policies.hotkeys import HotKeys, choose_hot, hit_rate
from trimtab.runtime.rows import row_span, width_of


class HotRows:
    """The hot rows of one table: ids (sorted), values, the access counts behind them.

    Attributes:
        version: the hot set's version (each choice that changes it adds one).
        unsent: chunks whose server is yet to be told the current set.
        stale: chunks whose server answered with another version.
        period: 0 (every update of a held row comes back with the pushes' answers,
            in every consistency mode: what trimtab's servers do), or the most forwards
            the replicas serve between two reads of every held row's values (a
            caller's choice; nothing in trimtab sets it now).
        fetched: the forward (:attr:`forwards`) whose reads last brought every held
            row's values; ``max_age``: the most forwards a read of a held row found
            them older than that.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, settings: HotKeys) -> None:
        self.settings = settings
        self.shape = shape
        self.ids = torch.zeros(0, dtype=torch.int64)
        self.values = torch.zeros(0, *shape[1:], dtype=dtype)
        self._counts = torch.zeros(shape[0], dtype=torch.float32)
        self.version = 0
        self.unsent: set[int] | None = None  # None: every chunk
        self.stale: set[int] = set()
        self.forwards = 0
        self.period = 0
        self.fetched = 0
        self.max_age = 0
        self.hits = 0
        self.reads = 0

    def due(self, ahead: int = 0) -> bool:
        """Whether the forward ``ahead`` forwards after the last one counted chooses the
        hot set again (every ``refresh_steps``; ``ahead=0``: the one just counted)."""
        size, every = self.settings.size, self.settings.refresh_steps
        return size > 0 and (self.forwards + ahead) % every == 0

    def refresh_due(self, ahead: int = 0) -> bool:
        """Whether the forward ``ahead`` forwards after the last one is due to read every
        held row afresh (:attr:`period`; never under BSP, nor with no row held: a
        classic table under SSP does no replica work)."""
        if self.period <= 0 or self.ids.numel() == 0:
            return False
        return self.forwards + ahead - self.fetched >= self.period

    def count(self, unique: torch.Tensor) -> None:
        """This forward reads rows ``unique``."""
        self._counts[unique] += 1
        self.forwards += 1

    def choose(self) -> torch.Tensor | None:
        """The next hot set by the policy, or None if it is the current one. Decays the
        counts (recent reads weigh more)."""
        k = min(self.settings.size * 2, self.shape[0])
        # A row counting below the floor over the margin is chosen neither held nor new:
        # the top k of the others are the candidates the policy would keep of the top k
        # of all (a search of the whole table's counts took ~5 ms a table here).
        able = (self._counts >= self.settings.floor / self.settings.margin).nonzero().view(-1)
        if able.numel() > k:
            top = torch.topk(self._counts[able], k)
            rows, counts = able[top.indices], top.values
        else:
            rows, counts = able, self._counts[able]
        candidates = zip(rows.tolist(), counts.tolist(), strict=True)
        chosen = choose_hot(candidates, self.ids.tolist(), self.settings)
        self._counts.mul_(self.settings.decay)
        new = torch.tensor(chosen, dtype=torch.int64)
        return None if torch.equal(new, self.ids) else new

    def hold(self, ids: torch.Tensor, values: torch.Tensor, *, new_set: bool) -> None:
        """Hold rows ``ids`` (sorted) with ``values`` (current); ``new_set``: a new
        version of the set, to be told to every chunk's server."""
        self.ids, self.values = ids, values.clone()
        self.fetched = self.forwards
        if new_set:
            self.version += 1
            self.unsent = None
        elif self.unsent is not None:
            self.unsent |= self.stale  # (their servers lack the set: tell them again)
        self.stale.clear()

    def split(self, unique: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Of rows ``unique`` (sorted): which are hot (a mask) and their held values.
        Counts the reads and hits."""
        if self.ids.numel() == 0:
            hot = torch.zeros(unique.numel(), dtype=torch.bool)
            rows = self.values[:0]
        else:
            at = torch.searchsorted(self.ids, unique).clamp_(max=self.ids.numel() - 1)
            hot = self.ids[at] == unique
            rows = self.values[at[hot]]
        self.reads += unique.numel()
        hits = int(hot.sum())
        self.hits += hits
        if hits and self.period:  # (under BSP every update comes back: no age)
            self.max_age = max(self.max_age, self.forwards - self.fetched)
        return hot, rows

    def in_chunk(self, width: int, offset: int, numel: int) -> torch.Tensor:
        """The hot ids with an element in the chunk ``[offset, offset + numel)``."""
        first, end = row_span(width, offset, numel)
        lo, hi = torch.searchsorted(self.ids, torch.tensor([first, end])).tolist()
        return self.ids[lo:hi].contiguous()

    def write(self, positions: torch.Tensor, values: torch.Tensor) -> None:
        """Take a round's changed elements (flat positions in the table): those of held
        rows."""
        if self.ids.numel() == 0 or positions.numel() == 0:
            return
        width = width_of(self.shape)
        rows = positions // width
        at = torch.searchsorted(self.ids, rows).clamp_(max=self.ids.numel() - 1)
        mine = self.ids[at] == rows
        flat = self.values.view(self.ids.numel(), -1)
        flat[at[mine], (positions % width)[mine]] = values[mine].to(flat.dtype)

    def write_rows(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Take a round's changed rows ``ids`` (sorted) whole, ``rows`` their new
        elements (``[len(ids), width]``): those of held rows (:meth:`write` for the
        elements of a chunk that cuts rows). Never blocks."""
        if self.ids.numel() == 0 or ids.numel() == 0:
            return
        at = torch.searchsorted(self.ids, ids).clamp_(max=self.ids.numel() - 1)
        mine = self.ids[at] == ids
        flat = self.values.view(self.ids.numel(), -1)
        if bool(mine.all()):  # (a server answers a worker's hot rows only)
            flat[at] = rows.to(flat.dtype)
        else:
            flat[at[mine]] = rows[mine].to(flat.dtype)

    def report(self) -> dict[str, float]:
        """The hot set's size and version, reads and the share the hot set served."""
        return {
            "hot_rows": self.ids.numel(),
            "version": self.version,
            "reads": self.reads,
            "hits": self.hits,
            "hit_rate": hit_rate(self.hits, self.reads),
            "max_age": self.max_age,
        }
