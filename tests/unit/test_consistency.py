"""Consistency policies: pure decisions, and their effect with all roles in one process."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import trimtab
from trimtab import ConfigError, Context
from trimtab.policies.consistency import CONSISTENCY, PushInfo


def push(clock: int = 0, read: int = 0, now: int = 0) -> PushInfo:
    return PushInfo(worker=0, clock=clock, weight=1.0, version_read=read, version_now=now)


def test_bsp_wants_the_current_clock_and_every_worker() -> None:
    bsp = CONSISTENCY.create("bsp")
    assert bsp.check(push(clock=3), 3, 2) is None
    assert "clock" in (bsp.check(push(clock=4), 3, 2) or "")
    assert not bsp.ready({0, 1}, {0, 1, 2})
    assert bsp.ready({0, 1, 2}, {0, 1, 2})


def test_what_the_roles_ask_a_consistency_policy() -> None:
    policies = {name: CONSISTENCY.create(name, workers=3) for name in CONSISTENCY.names()}
    assert {n for n, p in policies.items() if p.synchronous} == {"bsp"}
    assert {n for n, p in policies.items() if p.skips_stragglers} == {"saps"}
    assert {n: p.job_args(staleness=5) for n, p in policies.items()} == {
        "asp": {},
        "bsp": {},
        "saps": {},
        "ssp": {"staleness": 5},
    }
    made = CONSISTENCY.create("ssp", workers=3, **policies["ssp"].job_args(staleness=5))
    assert made.may_release(9, {0: 4, 1: 9}, [0, 1]) and not made.may_release(9, {0: 3}, [0])


def test_async_modes_refuse_going_back_in_time() -> None:
    for name in ("asp", "ssp", "saps"):
        policy = CONSISTENCY.create(name, workers=4)
        assert policy.check(push(clock=5), 0, 4) is None
        assert policy.check(push(clock=4), 0, 4) is not None
        assert policy.ready({0}, {0, 1, 2, 3})


def test_ssp_holds_a_worker_too_far_ahead() -> None:
    ssp = CONSISTENCY.create("ssp", workers=2, staleness=2)
    assert ssp.may_release(3, {0: 3, 1: 1}, {0, 1})
    assert not ssp.may_release(4, {0: 4, 1: 1}, {0, 1})
    with pytest.raises(ConfigError):
        CONSISTENCY.create("ssp", staleness=-1)


def test_saps_discounts_stale_gradients_and_drops_very_stale_ones() -> None:
    saps = CONSISTENCY.create("saps", workers=4)  # free = 3, tau_max = 16
    assert saps.discount(push(read=10, now=13)) == 1.0
    assert saps.discount(push(read=10, now=16)) == pytest.approx(0.5)
    assert saps.discount(push(read=0, now=17)) is None


def _train_async(cluster, steps: int, delays: dict[int, float], record: list) -> list:
    lock = threading.Lock()

    def body(ctx: Context) -> list[float]:
        g = torch.Generator().manual_seed(3)
        model = torch.nn.Linear(8, 1)
        with torch.no_grad():
            model.weight.copy_(torch.randn(1, 8, generator=g))
            model.bias.zero_()
        target = torch.randn(8, 1, generator=g)
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(), context=ctx
        )
        losses = []
        for step in range(steps):
            x = torch.randn(16, 8, generator=g)
            opt.zero_grad()
            loss = (model(x) - x @ target).pow(2).mean()
            loss.backward()
            time.sleep(delays.get(ctx.rank, 0.0))
            opt.step()
            losses.append(loss.item())
            with lock:
                record.append((ctx.rank, step + 1, time.monotonic()))
        return losses

    return cluster.run_workers(body)


@pytest.mark.parametrize("mode", ["asp", "saps"])
def test_async_modes_train_without_waiting(cluster_factory, mode: str) -> None:
    cluster = cluster_factory(workers=2, servers=2, consistency=mode, chunk_bytes=64)
    record: list = []
    losses = _train_async(cluster, 30, {1: 0.03}, record)
    assert losses[0][-1] < 0.2 * losses[0][0]  # it learns
    # The fast worker finished its 30 steps while the slow one was far from done.
    fast_done = max(t for r, s, t in record if r == 0)
    slow_at = max((s for r, s, t in record if r == 1 and t <= fast_done), default=0)
    assert slow_at < 20


def test_ssp_bounds_how_far_the_fast_worker_leads(cluster_factory) -> None:
    cluster = cluster_factory(workers=2, servers=1, consistency="ssp", staleness=2)
    record: list = []
    _train_async(cluster, 15, {1: 0.02}, record)
    done = {0: 0, 1: 0}
    for rank, step, _ in sorted(record, key=lambda r: r[2]):
        done[rank] = step
        # A worker that finished clock c needed the slowest at >= c - staleness.
        assert done[0] - done[1] <= 2 + 1
    assert done == {0: 15, 1: 15}


def test_saps_discounts_drops_and_makes_the_straggler_skip_ahead(cluster_factory) -> None:
    cluster = cluster_factory(workers=3, servers=1, consistency="saps", chunk_bytes=64)
    stats: list = []

    def body(ctx: Context) -> int:
        model = torch.nn.Linear(4, 1)
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(), context=ctx
        )
        steps = 6 if ctx.rank == 2 else 40
        for _ in range(steps):
            if ctx.rank == 2:
                time.sleep(0.15)  # a straggler: 2 fast workers push ~dozens of updates meanwhile
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
        ctx.barrier()
        if ctx.rank == 0:
            stats.extend(ctx.server_stats())
        return opt.skipped

    skipped = cluster.run_workers(body)
    total = stats[0]
    assert total["dropped"] + total["discounted"] >= 2
    # The coordinator saw worker 2 lag and told it to refresh instead of pushing.
    assert skipped[0] == skipped[1] == 0 and skipped[2] >= 1
    assert total["pushes"] == (40 + 40 + 6 - skipped[2]) * 2  # weight and bias chunks
