"""Sparse gradients (``nn.EmbeddingBag(sparse=True)``) through DistributedOptimizer, all
roles in one process: the rows travel, the servers apply torch's sparse semantics, the
result is one process's (over TCP too: tests/integration/test_sparse.py)."""

from __future__ import annotations

import pytest
import torch

import trimtab
from tests.sparse_job import (
    OPTIMIZERS,
    Model,
    global_batches,
    loss_of,
    max_difference,
    reference,
    train_worker,
)


@pytest.mark.parametrize("server", [False, True], ids=["torch-table", "server-table"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_sparse_bsp_matches_one_process(cluster_factory, name: str, server: bool) -> None:
    """torch's EmbeddingBag(sparse=True) on every worker, or trimtab.nn.EmbeddingBag
    (the table only on the servers): one process's parameters."""
    sizes = (10, 14)
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)
    results = cluster.run_workers(
        lambda ctx: train_worker(name, sizes, ctx.rank, ctx, server=server)
    )
    expected = reference(name, server=server)
    for got in results:
        assert max_difference(got, expected) < 1e-5


@pytest.mark.parametrize("when", ["after", "half", pytest.param("before", marks=pytest.mark.slow)])
def test_prefetched_rows_are_taken_only_when_current(cluster_factory, when: str) -> None:
    """``table.prefetch(next ids)`` after step(): the next forward takes those rows; sent
    before step(), those answered before their chunk's update are read again (the
    others, answered after the round completed, are taken); announcing half the ids, the
    forward takes those and reads the rest: the same result every way, and the worker
    never holds the table (one element of storage)."""
    sizes = (10, 14)
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)
    counts: list[dict] = [{}, {}]
    results = cluster.run_workers(
        lambda ctx: train_worker(
            "adagrad", sizes, ctx.rank, ctx, server=True, prefetch=when, counters=counts[ctx.rank]
        )
    )
    expected = reference("adagrad", server=True)
    for got, count in zip(results, counts, strict=True):
        assert max_difference(got, expected) < 1e-5
        assert count["storage"] == 4  # a float32: the weight's one element
        if when == "after":  # (the first step's rows only are read by the forward)
            assert count["prefetched"] > 0 and count["read"] < count["prefetched"]
        if when == "half":  # (before, the forward read every row or none of these)
            assert count["prefetched"] > 0 and count["read"] > count["first"]


@pytest.mark.parametrize(
    ("name", "chunk_bytes"), [("sgd", 256), ("sparseadam", 256), ("sparseadam", 192)]
)
def test_hot_rows_replicated_on_workers_change_nothing_under_bsp(
    cluster_factory, name: str, chunk_bytes: int
) -> None:
    """NuPS's hot set (40 rows, chosen again every 3 steps) read from each worker's
    replicas, kept in step by the servers' answers: the same parameters as one process,
    most reads served by the replicas, and the next rows prefetched as well. Chunks of
    256 bytes cut rows of 6 floats in two; of 192, they hold whole rows (the answers'
    rows are then taken whole)."""
    sizes = (10, 14)
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=chunk_bytes)
    counts: list[dict] = [{}, {}]
    results = cluster.run_workers(
        lambda ctx: train_worker(
            name,
            sizes,
            ctx.rank,
            ctx,
            server=True,
            prefetch="after",
            counters=counts[ctx.rank],
            hot=40,
        )
    )
    expected = reference(name, server=True)
    for got, count in zip(results, counts, strict=True):
        assert max_difference(got, expected) < 1e-5
        report = count["hot"]
        assert 0 < report["hot_rows"] <= 40 and report["version"] >= 2, report
        assert report["hit_rate"] > 0.2, report


def test_only_touched_rows_travel_and_every_copy_is_exact(cluster_factory) -> None:
    """A step touches a few rows: those go out (deduplicated), and only the rows that
    changed come back; each worker's whole table (state_dict) equals the servers'."""
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)

    def body(ctx: trimtab.Context) -> tuple[int, int, list[torch.Tensor]]:
        model = Model(42)
        opt = trimtab.DistributedOptimizer(
            torch.optim.Adagrad(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        ids = torch.tensor([3, 3, 7, 3] if ctx.rank == 0 else [7, 400])
        for _ in range(3):
            opt.zero_grad()
            model(ids, torch.tensor([0, 2]), torch.ones(2, 4)).sum().backward()
            opt.step()
        rows = opt._pusher.rows
        opt.refresh()  # the servers' values, whole: the copy must not change
        return rows.rows_sent, rows.rows_received, list(model.state_dict().values())

    (sent0, got0, a), (sent1, got1, b) = cluster.run_workers(body)
    # Rows 3 and 7 (one chunk each), 7 and 400: deduplicated, at most 2 chunks a row.
    assert 0 < sent0 <= 3 * 2 * 2 and 0 < sent1 <= 3 * 2 * 2
    assert got0 == got1 <= 3 * 3 * 2  # the union, {3, 7, 400}, per step
    assert max_difference(a, b) == 0.0


def test_optimizers_torch_refuses_sparse_gradients_for_are_refused_alike(cluster_factory) -> None:
    cluster = cluster_factory(workers=1, servers=1)

    def body(ctx: trimtab.Context) -> None:
        model = Model(42)
        for inner, error in [
            (torch.optim.Adam(model.parameters()), "Adam does not support sparse gradients"),
            (torch.optim.Adagrad(model.parameters(), weight_decay=0.1), "weight_decay option"),
            (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), "without momentum"),
        ]:
            opt = trimtab.DistributedOptimizer(inner, model.named_parameters(), context=ctx)
            opt.zero_grad()
            out = model(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(1, 4)).sum()
            with pytest.raises((RuntimeError, trimtab.UsageError), match=error):
                out.backward()  # (raised by the gradient's hook, before any push)
            opt.close()
            for p in model.parameters():
                p.grad = None

    cluster.run_workers(body)


@pytest.mark.slow  # (2.5 s: the default tier's budget)
@pytest.mark.parametrize(("mode", "server"), [("asp", False), ("ssp", True)])
def test_sparse_rows_train_asynchronously(cluster_factory, mode: str, server: bool) -> None:
    """Under ASP and SSP each row push is an update of its own (no equivalence to hold):
    torch's sparse table and a server table train, the loss falls."""
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256, consistency=mode)

    def body(ctx: trimtab.Context) -> tuple[float, float]:
        model = Model(42, server=server)
        opt = trimtab.DistributedOptimizer(
            torch.optim.Adagrad(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        batches = global_batches(12)
        bags, x, y = batches[0]
        before = float(loss_of(model, bags, x, y).detach())
        for step_bags, step_x, step_y in batches:
            opt.zero_grad()
            loss_of(
                model, step_bags[ctx.rank :: 2], step_x[ctx.rank :: 2], step_y[ctx.rank :: 2]
            ).backward()
            opt.step()
        opt.refresh()
        return before, float(loss_of(model, bags, x, y))

    for before, after in cluster.run_workers(body):
        assert after < before
