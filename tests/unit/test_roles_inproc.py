"""All roles in one process, on the in-process transport: the logic above the transport
(aggregation, weighting, optimizer modes, routing errors, Horovod's contract)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import pytest
import torch

import trimtab
from tests.equivalence_job import Setup, max_difference, reference, train_worker
from trimtab import ChunkMoved, ConfigError, Context, RemoteError, UsageError
from trimtab.protocol.messages import Control, Data
from trimtab.roles.worker.client import wait

MATRIX = [
    # (optimizer, per-worker batch sizes, servers): unequal sizes sum to the global batch
    ("sgd", (10, 14), 2),
    ("sgd", (12, 12), 1),
    ("sgd", (5, 19), 2),
    ("sgd", (4, 8, 12), 1),
    ("sgd", (10, 3, 11), 2),
    ("adam", (5, 7, 12), 2),
    ("adam", (12, 12), 2),
    ("adam", (17, 7), 1),
    ("adam", (2, 20, 2), 2),
    ("adam", (8, 8, 8), 1),
    ("rmsprop-sum", (20, 4), 2),
    ("rmsprop-sum", (9, 15), 2),
]


@pytest.mark.parametrize(
    ("optimizer", "sizes", "servers"),
    MATRIX,
    ids=[f"{o}-{len(b)}w{s}s-{'x'.join(map(str, b))}" for o, b, s in MATRIX],
)
def test_bsp_matches_one_process(
    cluster_factory, optimizer: str, sizes: tuple[int, ...], servers: int
) -> None:
    """Invariant 1 over the matrix of optimizers, batch splits and server counts (three
    of them over TCP too: tests/integration/test_equivalence.py)."""
    setup = Setup(optimizer, sizes)
    cluster = cluster_factory(workers=setup.workers, servers=servers, chunk_bytes=256)
    results = cluster.run_workers(lambda ctx: train_worker(setup, ctx.rank, ctx))
    expected = reference(setup)
    for got in results:
        assert max_difference(got, expected) < 1e-5


def test_moved_and_unknown_chunks_are_answered(cluster_factory) -> None:
    cluster = cluster_factory(workers=1, servers=2, chunk_bytes=256)

    def body(ctx: Context) -> None:
        model = torch.nn.Linear(20, 20)
        trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        assert ctx.placement is not None
        chunk = 0
        wrong = ctx.placement.servers[1 - ctx.placement.owners[chunk]]
        with pytest.raises(ChunkMoved) as moved:
            wait(ctx.client.request(wrong, {"o": int(Data.PULL), "c": chunk, "e": 1}), 10)
        assert moved.value.owner == ctx.placement.owners[chunk]
        with pytest.raises(RemoteError) as unknown:
            wait(ctx.client.request(wrong, {"o": int(Data.PULL), "c": 10_000, "e": 1}), 10)
        assert unknown.value.code == "unknown_chunk"

    cluster.run_workers(body)


def test_zero_grad_between_backward_and_step_is_refused(cluster_factory) -> None:
    cluster = cluster_factory(workers=1, servers=1)

    def body(ctx: Context) -> None:
        model = torch.nn.Linear(4, 2)
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        model(torch.randn(3, 4)).sum().backward()
        with pytest.raises(UsageError, match="zero_grad"):
            opt.zero_grad()
        opt.step()
        opt.zero_grad()
        assert opt.clock == 1
        assert opt.state_dict()["trimtab"] == {"clock": 1, "epoch": 1}

    cluster.run_workers(body)


def test_workers_declaring_different_models_get_a_clear_error(cluster_factory) -> None:
    cluster = cluster_factory(workers=2, servers=1)

    def body(ctx: Context) -> None:
        model = torch.nn.Linear(4, 2 + ctx.rank)
        with pytest.raises(RemoteError, match="declared different tensors"):
            trimtab.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
            )

    cluster.run_workers(body)


def test_unused_parameters_do_not_block_and_are_not_stepped(cluster_factory) -> None:
    cluster = cluster_factory(workers=2, servers=1)

    def body(ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        used, unused = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
        params = [*used.parameters(), *unused.parameters()]
        names = [(f"p{i}", p) for i, p in enumerate(params)]
        opt = trimtab.DistributedOptimizer(torch.optim.Adam(params, lr=0.1), names, context=ctx)
        before = unused.weight.detach().clone()
        for _ in range(3):
            opt.zero_grad()
            used(torch.ones(2, 4)).sum().backward()
            opt.step()
        return before, unused.weight.detach().clone()

    for before, after in cluster.run_workers(body):
        assert torch.equal(before, after)


#: The compute time the LB-BSP test emulates per sample (worker 1: three times it).
#: Reported, never slept: a second a sample dwarfs what a busy machine adds to the
#: communication times the policy also measures (milliseconds).
SECONDS_PER_SAMPLE = 1.0


def test_lbbsp_changes_batch_sizes_every_step_and_stays_equivalent(cluster_factory) -> None:
    """Invariant 1 with LB-BSP: sizes follow measured speeds (worker 1 emulated 3x slower);
    the update is still the one-process step over the global batch.

    Each worker's compute time is emulated by a step hook (its samples times
    :data:`SECONDS_PER_SAMPLE`, three times that for worker 1), so the speeds the policy
    sees hold however busy the machine is. The real times of this tiny model were
    scheduling noise with every core busy: the slow worker once got 1 of 24 samples."""
    setup = Setup("sgd", (8, 8, 8))
    cluster = cluster_factory(workers=3, servers=2, chunk_bytes=256, batching="lbbsp")
    used: dict[int, list] = {0: [], 1: [], 2: []}

    def body(ctx: Context) -> list[torch.Tensor]:
        slowdown = 3.0 if ctx.rank == 1 else 1.0

        def emulated(clock: int, compute_s: float) -> float:
            samples = used[ctx.rank][clock][ctx.rank]  # this step's size, as trained
            return samples * SECONDS_PER_SAMPLE * slowdown

        ctx.add_step_hook(emulated)
        return train_worker(setup, ctx.rank, ctx, used[ctx.rank])

    results = cluster.run_workers(body)
    expected = reference(setup)
    for got in results:
        assert max_difference(got, expected) < 1e-5
    sizes = used[0]
    assert used[1] == sizes and used[2] == sizes  # every worker split the same way
    assert all(sum(s) == 24 for s in sizes)
    assert len(set(sizes)) >= 2  # the sizes moved
    # From the third step on (the policy is one step behind the reports), the slow
    # worker gets less.
    steered = sizes[2:]
    assert all(s[1] < s[0] and s[1] < s[2] for s in steered), steered


def test_forward_waiting_per_module_matches_one_process(cluster_factory) -> None:
    setup = Setup("sgd", (9, 15), overlap=True)
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)
    results = cluster.run_workers(lambda ctx: train_worker(setup, ctx.rank, ctx))
    for got in results:
        assert max_difference(got, reference(Setup("sgd", (9, 15)))) < 1e-5


def _overlapping_sgd(model: torch.nn.Module, ctx: Context) -> trimtab.DistributedOptimizer:
    """Server-side SGD whose next forward waits per module (``model=``)."""
    return trimtab.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        model.named_parameters(),
        context=ctx,
        model=model,
    )


def test_with_model_each_forward_waits_only_for_its_own_parameters(cluster_factory) -> None:
    """After step(), a module's parameters change when its forward runs, not before;
    the others' only at their own forward (or state_dict()). (The job's first step is
    synchronous: it probes whether the script calls synchronize() itself.)"""
    cluster = cluster_factory(workers=1, servers=2, chunk_bytes=256)

    def body(ctx: Context) -> None:
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        opt = _overlapping_sgd(model, ctx)
        x = torch.randn(4, 6)
        for _ in range(2):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
        first, last = model[0].weight.detach().clone(), model[2].weight.detach().clone()
        model[0](x)  # the first layer's forward alone
        assert not torch.equal(model[0].weight, first)  # its update landed
        assert torch.equal(model[2].weight, last)  # the last layer's is still arriving
        state = model.state_dict()  # waits for everything
        assert not torch.equal(state["2.weight"], last)

    cluster.run_workers(body)


def test_with_model_parameters_read_after_forward_are_current(cluster_factory) -> None:
    """A parameter whose module's forward does not run (here one read only in the loss)
    has its new value once the model's forward returns."""
    cluster = cluster_factory(workers=1, servers=2, chunk_bytes=256)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(6, 2)
            self.penalised = torch.nn.Linear(2, 2)  # no forward of its own runs

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    def body(ctx: Context) -> None:
        model = Net()
        opt = _overlapping_sgd(model, ctx)
        x = torch.randn(4, 6)
        for _ in range(2):  # the first step is synchronous (the probe)
            opt.zero_grad()
            (model(x).square().sum() + model.penalised.weight.sum()).backward()
            opt.step()
        before = model.penalised.weight.detach().clone()
        model(x)
        assert not torch.equal(model.penalised.weight, before)

    cluster.run_workers(body)


def test_workers_report_what_they_observe_of_each_server(cluster_factory) -> None:
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256, placement="psld")

    def body(ctx: Context) -> None:
        model = torch.nn.Linear(20, 20)
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        for _ in range(4):
            model(torch.ones(3, 20)).sum().backward()
            opt.step()
        # A malformed report is refused with a reason; the job goes on.
        bad = ctx.client.control(
            {
                "o": int(Control.REPORT),
                "k": 9,
                "b": 1,
                "cs": 0.1,
                "ms": 0.1,
                "cpu": 1.0,
                "sv": [[7, 0.1, 0.1, 100]],
            }
        )
        with pytest.raises(RemoteError, match="bad per-server spans"):
            wait(bad, 10.0)
        model(torch.ones(3, 20)).sum().backward()
        opt.step()

    cluster.run_workers(body)
    seen = cluster.coordinator.status()["worker_speeds"]
    assert len(seen) == 2
    for bounds in seen:  # every server owns chunks of the model: both were timed
        assert bounds is not None
        lower, upper = bounds
        assert lower > 0 and (upper is None or upper >= lower)


def test_a_push_that_was_moved_is_not_counted_as_work_of_the_server_it_reached(
    cluster_factory,
) -> None:
    # After a migration a worker may push to a chunk's old owner, which answers "moved";
    # the push is resent to the new owner. The old owner did none of that work, but the
    # push crossed its link within the step's span: with its bytes a 20 MB/s server read
    # 56 MB/s, without them one cut at the round under way read a third of its speed.
    # So a server that turned a push away this step has no figure for it.
    cluster = cluster_factory(workers=1, servers=2, chunk_bytes=256, placement="psld")
    spans: list[dict[int, float]] = []

    def body(ctx: Context) -> None:
        model = torch.nn.Linear(20, 20)
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        real_spans = opt._reporter.spans_of_step

        def spy(traffic: dict[int, list[float]], waited: float) -> list[list[float]]:
            out = real_spans(traffic, waited)
            spans.append({int(row[0]): row[3] for row in out})
            return out

        opt._reporter.spans_of_step = spy  # type: ignore[method-assign]
        model(torch.ones(3, 20)).sum().backward()
        opt.step()
        # A stale map for the pushes of the next backward: server 0's chunks go to 1.
        right = ctx.routes  # (a push routes its chunks by Context.routes)
        ctx.routes = lambda chunks, clock: [(1, ctx.address(1)) for _ in chunks]  # type: ignore[method-assign]
        model(torch.ones(3, 20)).sum().backward()
        ctx.routes = right  # type: ignore[method-assign]
        opt.step()  # server 1 answers "moved" for server 0's chunks; they are resent
        assert ctx.placement is not None and 0 in ctx.placement.owners

    cluster.run_workers(body)
    first, second = spans[0], spans[-1]
    assert set(first) == {0, 1} and first[0] > 0 and first[1] > 0
    # Server 1 turned server 0's pushes away: no figure for it this step.
    assert 1 not in second
    assert 0 not in second  # its resent pushes were not timed from the first push
    assert set(spans[0]) == {0, 1}  # (both timed in a step without a move)


def test_values_land_in_a_parameter_whose_memory_was_replaced(cluster_factory) -> None:
    # Workers write small chunks' values through a byte view kept per parameter: a
    # parameter given new memory between steps (p.data = ...) must get them there.
    cluster = cluster_factory(workers=1, servers=1, chunk_bytes=256)  # 100 floats: 2 chunks

    def body(ctx: Context) -> torch.Tensor:
        p = torch.nn.Parameter(torch.zeros(100))
        opt = trimtab.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), [("p", p)], context=ctx)
        for step in range(3):
            if step == 1:
                p.data = p.data.clone()
            p.grad = torch.arange(100, dtype=torch.float32)
            opt.step()
        return p.detach().clone()

    for got in cluster.run_workers(body):
        assert torch.equal(got, -3.0 * torch.arange(100, dtype=torch.float32))


def test_a_push_routed_by_an_old_map_to_a_chunks_next_owner_is_sent_back(
    cluster_factory,
) -> None:
    # A chunk moves A -> B, back to A, then to B again, while worker 0 keeps the map of
    # the first move. In the third move worker 1 has pushed clock 0 already, so that
    # round stays with A (cut 1). Worker 0's push of clock 0, sent to B by its old map,
    # must be answered "moved" (to reach A after a map refresh), not held by B until the
    # chunk arrives: A hands the chunk over only once that very push is in. Held, both
    # workers waited forever (a hang seen in CI, with forced migrations and scaling).
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256, rebalance_every=1)
    gate = threading.Barrier(2, timeout=20)
    chunk = 0

    def status(ctx: Context) -> dict[str, Any]:
        return ctx.call({"o": int(Control.STATUS)}).header

    def step_boundary(ctx: Context, clock: int, settled: bool) -> None:
        # Both workers report step `clock`: rebalance_every=1 then moves every chunk to
        # the other server (the next map's epoch is clock + 2).
        ctx.call({"o": int(Control.REPORT), "k": clock, "b": 1, "cs": 0.01, "ms": 0.0, "cpu": 1})
        gate.wait()
        deadline = time.monotonic() + 20
        while (s := status(ctx))["epoch"] < clock + 2 or (settled and s["migrating"]):
            assert time.monotonic() < deadline, f"no migration to epoch {clock + 2}: {s}"
            time.sleep(0.01)
        gate.wait()

    def push(ctx: Context, address: str) -> concurrent.futures.Future[Any]:
        assert ctx.placement is not None
        header = {"o": int(Data.PUSH), "c": chunk, "e": ctx.placement.epoch, "r": ctx.rank}
        header.update(k=0, w=1, v=0, z=True)  # clock 0, no gradient
        return ctx.client.request(address, header)

    def body(ctx: Context) -> None:
        model = torch.nn.Linear(4, 4)
        trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        assert ctx.placement is not None
        a = ctx.server_of(chunk)
        step_boundary(ctx, 0, settled=True)  # epoch 2: the chunk at B
        if ctx.rank == 0:
            ctx.refresh_map(2)  # ... and worker 0 keeps this map
            b = ctx.server_of(chunk, 0)
            assert b != a
        step_boundary(ctx, 1, settled=True)  # epoch 3: back at A
        first = None
        if ctx.rank == 1:
            ctx.refresh_map(3)
            first = push(ctx, ctx.server_of(chunk, 0))
            wait(ctx.client.request(a, {"o": int(Data.STATS)}), 10)  # the push is in
        step_boundary(ctx, 2, settled=False)  # epoch 4: to B, from clock 1
        if ctx.rank == 0:
            with pytest.raises(ChunkMoved) as moved:
                wait(push(ctx, b), 5)
            assert moved.value.epoch == 4
            ctx.refresh_map(moved.value.epoch)
            assert ctx.server_of(chunk, 0) == a  # clock 0 is still A's
            wait(push(ctx, a), 10)
        else:
            assert first is not None
            wait(first, 10)
        deadline = time.monotonic() + 20
        while status(ctx)["migrating"]:  # A hands the chunk over once the round is done
            assert time.monotonic() < deadline, "the chunk never left A"
            time.sleep(0.01)

    cluster.run_workers(body)


def test_a_drained_server_retires_only_once_no_request_routed_to_it_is_in_flight(
    cluster_factory,
) -> None:
    # Server 1 is drained (scaled to 1 server); its chunks move to server 0 (epoch 2).
    # Worker 0 has a push in flight that the old map routed (held by server 0, which
    # waits for worker 1's). Both workers fetch the new map: the coordinator used to
    # retire server 1 then, though a request sent by the old map may not have been read
    # yet; stopped before reading it, the server left its sender waiting forever (a hang
    # seen with scaling and forced migrations under load). It must wait until every
    # worker says it has nothing in flight from an older map.
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)
    gate = threading.Barrier(2, timeout=20)

    def status(ctx: Context) -> dict[str, Any]:
        return ctx.call({"o": int(Control.STATUS)}).header

    def report(ctx: Context) -> None:
        header = {"o": int(Control.REPORT), "k": 0, "b": 1, "cs": 0.01, "ms": 0.0, "cpu": 1}
        ctx.call({**header, "lo": ctx.routing_floor()})

    def push(ctx: Context, chunk: int) -> concurrent.futures.Future[Any]:
        assert ctx.placement is not None
        header = {"o": int(Data.PUSH), "c": chunk, "e": ctx.placement.epoch, "r": ctx.rank}
        header.update(k=0, w=1, v=0, z=True)  # clock 0, no gradient
        return ctx.client.request(ctx.server_of(chunk, 0), header)

    def body(ctx: Context) -> None:
        model = torch.nn.Linear(4, 4)
        trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        assert ctx.placement is not None and ctx.placement.epoch == 1
        kept = ctx.placement.owners.index(0)  # a chunk that stays on server 0
        held = push(ctx, kept) if ctx.rank == 0 else None
        gate.wait()
        if ctx.rank == 0:
            ctx.call({"o": int(Control.SCALE), "servers": 1})
            deadline = time.monotonic() + 20
            while (s := status(ctx))["epoch"] < 2 or s["migrating"]:
                assert time.monotonic() < deadline, f"server 1 was never drained: {s}"
                time.sleep(0.01)
            assert set(s["owners"]) == {0}
        gate.wait()
        ctx.refresh_map(2)
        assert ctx.routing_floor() == (1 if ctx.rank == 0 else 2)
        report(ctx)
        gate.wait()
        assert status(ctx)["live_servers"] == [0, 1]  # worker 0's push is still out
        gate.wait()
        if ctx.rank == 1:
            wait(push(ctx, kept), 10)  # the round completes: worker 0's push is answered
        else:
            assert held is not None
            wait(held, 10)
            assert ctx.routing_floor() == 2
            report(ctx)
            deadline = time.monotonic() + 20
            while status(ctx)["live_servers"] != [0]:
                assert time.monotonic() < deadline, "the drained server never retired"
                time.sleep(0.01)
            with pytest.raises(RemoteError, match="'lo'") as bad:
                ctx.call({"o": int(Control.MAP_GET), "e": 2, "lo": "old"})
            assert bad.value.code == "malformed"
        gate.wait()

    cluster.run_workers(body)


def test_context_misuse_says_what_to_do(cluster_factory) -> None:
    cluster = cluster_factory(workers=1, servers=1)

    def body(ctx: Context) -> None:
        with pytest.raises(UsageError, match="build the DistributedOptimizer"):
            ctx.server_of(0)
        with pytest.raises(UsageError, match="build the DistributedOptimizer"):
            ctx.server_stats()
        # A non-float tensor that needs no gradient is left out (not declared, not
        # pushed), in the param groups as in named_parameters.
        steps = torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)
        p = torch.nn.Parameter(torch.zeros(3))
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD([p, steps], lr=0.1), [("steps", steps), ("p", p)], context=ctx
        )
        assert {c.tensor for c in ctx.chunks} == {0} and ctx.chunks[0].numel == 3
        p.grad = torch.ones(3)
        opt.step()
        assert torch.allclose(p, torch.full((3,), -0.1)) and torch.equal(steps, torch.zeros(2))
        with pytest.raises(ConfigError, match=r"root_rank 3 is not a worker rank: pass one of 0\."):
            ctx.broadcast({"p": p}, root_rank=3)

    cluster.run_workers(body)
