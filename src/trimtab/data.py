"""Splitting each global batch among workers.

:class:`BalancedSampler` follows the batch sizes the job chooses at every step (LB-BSP
gives faster workers more of the global batch), reading them from the
:class:`~trimtab.DistributedOptimizer`.

:class:`GlobalBatchSampler` walks an epoch in global batches of ``B`` samples (a fresh
permutation per epoch, the same on every worker) and gives each worker its own
contiguous slice of every global batch, so that the workers together see each sample of
the epoch exactly once. It is a batch sampler: pass it to a ``DataLoader`` as
``batch_sampler=``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import torch

from trimtab.errors import ConfigError
from trimtab.policies.batching import equal_split


class GlobalBatchSampler:
    """Yields this worker's index list for every step of an epoch.

    Args:
        num_samples: dataset length.
        global_batch: samples per step over all workers.
        rank: this worker's rank.
        size: number of workers.
        batch_sizes: per-worker sizes summing to ``global_batch`` (equal by default).
        seed: permutation seed; call :meth:`set_epoch` each epoch for a new order.
        drop_last: drop a final, partial global batch.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        rank: int,
        size: int,
        batch_sizes: Sequence[int] | None = None,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if not 0 <= rank < size:
            raise ConfigError(f"rank {rank} is outside 0..{size - 1}")
        if global_batch < size:
            raise ConfigError(f"global batch {global_batch} is smaller than {size} workers")
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.rank = rank
        self.size = size
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.batch_sizes = list(batch_sizes or equal_split(global_batch, size))
        if len(self.batch_sizes) != size or sum(self.batch_sizes) != global_batch:
            raise ConfigError(
                f"batch_sizes {self.batch_sizes} must be {size} sizes summing to {global_batch}"
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch)
        return full + (0 if self.drop_last or rest == 0 else 1)

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_samples, generator=g).tolist()
        for step in range(len(self)):
            batch = order[step * self.global_batch : (step + 1) * self.global_batch]
            sizes = (
                self.batch_sizes
                if len(batch) == self.global_batch
                else equal_split(len(batch), self.size)
            )
            start = sum(sizes[: self.rank])
            yield batch[start : start + sizes[self.rank]]


class _Sized(Protocol):
    batch_sizes: list[int] | None
    batch_size: float


class BalancedSampler:
    """A batch sampler that gives this worker, at every step, its share of the global
    batch as the job decided it (``optimizer.batch_sizes``, which LB-BSP updates at each
    step boundary, and an elastic job whenever a worker is lost or joins: then it holds
    a size per rank ever given, 0 for a rank not taking part). Over an epoch the workers
    use every sample exactly once, whatever the sizes, as long as none is lost. It also
    sets ``optimizer.batch_size`` to each batch it yields, so the gradient is weighted
    by the samples it really came from.

    A worker that joined a running job starts where the job is: the sampler skips the
    steps of the epoch before the optimizer's ``clock`` (:attr:`start_epoch` says which
    epoch to begin with).

    Use it with ``DataLoader(dataset, batch_sampler=sampler)`` and ``num_workers=0`` (or
    iterate it yourself): the next step's sizes are known only when ``step()`` returns.

    Args:
        num_samples: dataset length.
        global_batch: samples per step over all workers (fixed).
        optimizer: the :class:`~trimtab.DistributedOptimizer` (anything with
            ``batch_sizes`` and ``batch_size``, and optionally ``clock``).
        rank: this worker's rank.
        size: number of workers the job starts with.
        seed: permutation seed; :meth:`set_epoch` picks the epoch's order.
        drop_last: drop a final, partial global batch.
        record: a directory: each step's indices this worker processed are appended to
            ``samples-rank{rank}.jsonl`` there, one ``[step, [indices]]`` per line,
            written once the step is over (the loop asked for the next batch), so a
            worker lost during a step leaves that step out. For equivalence checks of
            elastic jobs (:func:`processed_samples` reads them back).
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        optimizer: _Sized,
        rank: int,
        size: int,
        seed: int = 0,
        drop_last: bool = True,
        record: str | Path | None = None,
    ) -> None:
        if rank < 0:
            raise ConfigError(f"rank {rank} is negative")
        if global_batch < size or global_batch > num_samples:
            raise ConfigError(
                f"global batch {global_batch} must be between {size} workers "
                f"and {num_samples} samples"
            )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.optimizer = optimizer
        self.rank = rank
        self.size = size
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.record = None if record is None else Path(record) / f"samples-rank{rank}.jsonl"
        if optimizer.batch_sizes is None:
            if rank >= size:
                raise ConfigError(f"rank {rank} is outside 0..{size - 1}")
            optimizer.batch_sizes = equal_split(global_batch, size)
        optimizer.batch_size = optimizer.batch_sizes[rank]

    @property
    def start_epoch(self) -> int:
        """The epoch this worker begins with: 0, or where a running job it joined is."""
        return int(getattr(self.optimizer, "clock", 0)) // max(1, len(self))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch)
        return full + (0 if self.drop_last or rest == 0 else 1)

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_samples, generator=g).tolist()
        base = self.epoch * len(self)
        # A worker that joined mid-epoch begins at the job's step.
        first = int(getattr(self.optimizer, "clock", 0)) - base
        for step in range(first if 0 < first < len(self) else 0, len(self)):
            batch = order[step * self.global_batch : (step + 1) * self.global_batch]
            sizes = self.optimizer.batch_sizes
            if len(batch) < self.global_batch or sizes is None:
                sizes = equal_split(len(batch), self.size)
            elif self.rank >= len(sizes) or sum(sizes) != self.global_batch:
                raise ConfigError(
                    f"batch sizes {sizes} do not split the global batch "
                    f"{self.global_batch} among the job's workers (rank {self.rank})"
                )
            start = sum(sizes[: self.rank])
            mine = batch[start : start + sizes[self.rank]]
            self.optimizer.batch_size = max(1, len(mine))
            yield mine
            if self.record is not None:  # the step is over: its samples were processed
                with self.record.open("a") as f:
                    f.write(json.dumps([base + step, mine]) + "\n")


def processed_samples(directory: str | Path) -> dict[int, list[int]]:
    """Every step's samples as the workers recorded them in ``directory``
    (:class:`BalancedSampler`'s ``record``): step -> the indices of all workers, in
    rank order. Reads files; never blocks otherwise."""
    steps: dict[int, list[tuple[int, list[int]]]] = {}
    for path in sorted(Path(directory).glob("samples-rank*.jsonl")):
        rank = int(path.stem.removeprefix("samples-rank"))
        for line in path.read_text().splitlines():
            step, indices = json.loads(line)
            steps.setdefault(int(step), []).append((rank, [int(i) for i in indices]))
    return {s: [i for _, idx in sorted(parts) for i in idx] for s, parts in sorted(steps.items())}
