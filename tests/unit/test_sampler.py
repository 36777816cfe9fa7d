"""GlobalBatchSampler: every sample of an epoch is used exactly once across workers."""

from __future__ import annotations

import collections

import pytest

from trimtab import ConfigError
from trimtab.data import GlobalBatchSampler, equal_split


@pytest.mark.parametrize("sizes", [None, [5, 2, 9]])
@pytest.mark.parametrize("drop_last", [True, False])
def test_each_sample_once_per_epoch(sizes: list[int] | None, drop_last: bool) -> None:
    n, batch, workers = 103, 16, 3
    samplers = [
        GlobalBatchSampler(n, batch, r, workers, batch_sizes=sizes, seed=3, drop_last=drop_last)
        for r in range(workers)
    ]
    for epoch in range(2):
        seen: collections.Counter[int] = collections.Counter()
        steps = []
        for s in samplers:
            s.set_epoch(epoch)
            batches = list(s)
            steps.append(len(batches))
            for b in batches:
                seen.update(b)
        assert len(set(steps)) == 1  # every worker takes the same number of steps
        assert all(count == 1 for count in seen.values())
        assert len(seen) == (96 if drop_last else 103)
        if sizes:
            assert [len(next(iter(s))) for s in samplers] == sizes


def test_epochs_differ_and_bad_sizes_are_refused() -> None:
    s = GlobalBatchSampler(50, 10, 0, 2, seed=1)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    assert equal_split(10, 3) == [4, 3, 3]
    with pytest.raises(ConfigError):
        GlobalBatchSampler(50, 10, 0, 2, batch_sizes=[3, 3])
    with pytest.raises(ConfigError):
        GlobalBatchSampler(50, 10, 2, 2)
