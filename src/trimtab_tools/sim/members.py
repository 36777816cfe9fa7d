"""Which workers take part in a simulated job: the ``--fault`` specs' kills and joins
of workers, as an elastic job (``--min-workers``, ``--max-workers``) lives them.

As the runtime's ``roles/coordinator/elastic.py`` does: a worker killed at step k
pushes nothing of step k and is dropped at once (the step completes over the others;
the same global batch is split over them from the next step); ``worker:+N@K`` starts N
workers once a worker reached step K, each serving ``join_s`` later and taking part
from the first step boundary after that. The phases of a kill (``mid-push``,
``after-reply``) are taken as ``before-push``. Pure bookkeeping: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from trimtab.errors import ConfigError
from trimtab.faults.kills import Action, FaultSpec

__all__ = ["Members"]


class Members:
    """The live workers' ranks and the faults still to come. Not thread-safe.

    Args:
        workers: the job's workers at the start (ranks 0 to ``workers - 1``).
        faults: the ``--fault`` specs.
        elastic: whether the job goes on without a lost worker or takes new ones.
        min_workers, max_workers: the job's bounds (as its settings say them).

    Raises :class:`ConfigError` from the constructor for a server fault (not
    modelled), a kill of a rank the job does not have, or any worker fault in a job
    that is not elastic (a lost worker ends such a job, as in the runtime).
    """

    def __init__(
        self,
        workers: int,
        faults: Sequence[FaultSpec],
        *,
        elastic: bool,
        min_workers: int,
        max_workers: int,
    ) -> None:
        for f in faults:
            if f.role != "worker":
                raise ConfigError(f"--fault {f}: the simulator models no server deaths yet")
            if f.action is Action.KILL and not 0 <= f.index < workers:
                raise ConfigError(f"--fault {f}: the job has {workers} workers at the start")
        if faults and not elastic:
            raise ConfigError(
                "a worker's death or join needs an elastic job: --min-workers below "
                "--workers, or --max-workers above it"
            )
        self.ranks = list(range(workers))
        self.min_workers, self.max_workers = min_workers, max_workers
        self._kills = {f.index: f.step for f in faults if f.action is Action.KILL}
        self._joins = sorted((f.step, f.count) for f in faults if f.action is Action.JOIN)
        self._next_rank = workers
        self._ready: list[float] = []  # when each started worker could take part

    @property
    def slots(self) -> int:
        """Ranks ever given, plus those still to join: the most a job may use."""
        return self._next_rank + sum(count for _, count in self._joins)

    def lost_at(self, step: int) -> list[int]:
        """The live ranks that die at ``step``; they are dropped. Raises ConfigError
        if that leaves fewer than ``min_workers`` (the job would end)."""
        lost = [r for r in self.ranks if self._kills.get(r) == step]
        if lost:
            self.ranks = [r for r in self.ranks if r not in lost]
            if len(self.ranks) < self.min_workers:
                raise ConfigError(
                    f"workers {lost} die at step {step}, leaving {len(self.ranks)}: "
                    f"below --min-workers {self.min_workers}, the job would end"
                )
        return lost

    def reached(self, step: int, now: float, join_s: float) -> None:
        """A worker reached ``step`` at ``now``: the joins due start, each ready
        ``join_s`` later (no more than ``max_workers`` live or coming)."""
        while self._joins and self._joins[0][0] <= step:
            _, count = self._joins.pop(0)
            room = self.max_workers - len(self.ranks) - len(self._ready)
            self._ready += [now + join_s] * max(0, min(count, room))

    def joining(self, now: float) -> list[int]:
        """The ranks that take part from the boundary at ``now`` (new ones, ready)."""
        due = [t for t in self._ready if t <= now]
        self._ready = [t for t in self._ready if t > now]
        new = list(range(self._next_rank, self._next_rank + len(due)))
        self._next_rank += len(due)
        self.ranks += new
        return new
