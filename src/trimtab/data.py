"""Splitting each global batch among workers.

:class:`GlobalBatchSampler` walks an epoch in global batches of ``B`` samples (a fresh
permutation per epoch, the same on every worker) and gives each worker its own
contiguous slice of every global batch, so that the workers together see each sample of
the epoch exactly once. It is a batch sampler: pass it to a ``DataLoader`` as
``batch_sampler=``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from trimtab._exceptions import ConfigError


def equal_split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` sizes differing by at most one (larger first)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


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
