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


class _Opt:
    """Stands in for DistributedOptimizer: the job changes ``batch_sizes`` every step."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] | None = None
        self.batch_size = 0.0


def test_balanced_sampler_uses_each_sample_once_while_sizes_change_every_step() -> None:
    import random

    from trimtab.data import BalancedSampler

    n, batch, workers = 500, 40, 3
    opts = [_Opt() for _ in range(workers)]
    samplers = [BalancedSampler(n, batch, opts[r], r, workers, seed=5) for r in range(workers)]
    assert opts[0].batch_sizes == [14, 13, 13]  # equal split until the job says otherwise
    rng = random.Random(0)
    seen: collections.Counter[int] = collections.Counter()
    iters = [iter(s) for s in samplers]
    distinct = set()
    for _ in range(len(samplers[0])):
        cut = sorted(rng.sample(range(1, batch), workers - 1))
        sizes = [b - a for a, b in zip([0, *cut], [*cut, batch], strict=True)]
        distinct.add(tuple(sizes))
        for opt in opts:
            opt.batch_sizes = sizes  # what LB-BSP's reply sets at the step boundary
        for r, it in enumerate(iters):
            mine = next(it)
            assert len(mine) == sizes[r] == opts[r].batch_size
            seen.update(mine)
    assert len(distinct) > 10
    assert all(c == 1 for c in seen.values()) and len(seen) == 12 * batch


def test_balanced_sampler_refuses_sizes_that_do_not_split_the_batch() -> None:
    from trimtab.data import BalancedSampler

    opt = _Opt()
    sampler = BalancedSampler(100, 10, opt, 0, 2)
    opt.batch_sizes = [3, 3]
    with pytest.raises(ConfigError, match="do not split"):
        next(iter(sampler))
