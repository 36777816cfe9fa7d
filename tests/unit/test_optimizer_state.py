"""DistributedOptimizer's state and Horovod's recipes, all roles in one process: the
state gathered from the servers in torch's own layout, loaded back, broadcast to a fresh
rank; gradients changed between synchronize() and step(); op=Sum and predivide."""

from __future__ import annotations

import warnings

import pytest
import torch

import trimtab
from tests.equivalence_job import global_batches, loss_of, make_model, max_difference
from tests.state_job import OPTIMIZERS, reference, train
from trimtab import ConfigError, Context, UsageError
from trimtab.frontend.params import RESYNC_WARNING, reduce_op


def _wrap(
    ctx: Context, name: str, model: torch.nn.Module, **kw: object
) -> trimtab.DistributedOptimizer:
    return trimtab.DistributedOptimizer(
        OPTIMIZERS[name](model.parameters()), model.named_parameters(), context=ctx, **kw
    )


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_dict_has_torch_layout_and_values(cluster_factory, name: str) -> None:
    """Gathered from chunks on two servers, state_dict() is what the plain optimizer's
    is after the same steps: the same keys, shapes, dtypes and values, and the same
    param_groups; loaded into a plain optimizer, it continues as that one does."""
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)

    def body(ctx: Context) -> dict:
        model = make_model()
        opt = _wrap(ctx, name, model)
        train(opt, model, ctx.rank, 2, range(3))
        return opt.state_dict()

    got = cluster.run_workers(body)[0]
    model = make_model()
    plain = OPTIMIZERS[name](model.parameters())
    for x, y in global_batches(3):
        plain.zero_grad()
        loss_of(model, x, y).backward()
        plain.step()
    want = plain.state_dict()
    assert got.pop("trimtab")["clock"] == 3
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"])
    for i, state in want["state"].items():
        assert sorted(got["state"][i]) == sorted(state)
        for key, value in state.items():
            mine = got["state"][i][key]
            assert mine.shape == value.shape and mine.dtype == value.dtype, (i, key)
            assert torch.allclose(mine, value, rtol=1e-4, atol=1e-5), (i, key)
    fresh = OPTIMIZERS[name](make_model().parameters())
    fresh.load_state_dict(got)  # torch takes it as its own


@pytest.mark.parametrize("name", ["sgd", "adam", "rmsprop"])
def test_checkpoint_by_rank0_resumes_in_a_new_job(cluster_factory, name: str) -> None:
    """Rank 0 alone saves model and optimizer after 4 steps (the other worker goes on
    to its next step meanwhile); a new job whose rank 0 loads both and broadcasts them
    (Horovod's recipe: the other rank's optimizer has no state) ends where one process
    running all 8 steps does."""
    first = cluster_factory(workers=2, servers=2, chunk_bytes=256)
    saved: dict = {}

    def save(ctx: Context) -> None:
        model = make_model(42 if ctx.rank == 0 else 5)
        opt = _wrap(ctx, name, model)
        train(opt, model, ctx.rank, 2, range(4))
        if ctx.rank == 0:
            saved["model"] = {k: v.clone() for k, v in model.state_dict().items()}
            saved["optimizer"] = opt.state_dict()

    first.run_workers(save)
    second = cluster_factory(workers=2, servers=2, chunk_bytes=256)

    def resume(ctx: Context) -> list[torch.Tensor]:
        model = make_model(1 if ctx.rank == 0 else 2)  # neither is the saved one
        opt = _wrap(ctx, name, model)
        if ctx.rank == 0:
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optimizer"])
        ctx.broadcast(dict(model.state_dict()), 0)
        opt.broadcast_state(0)  # trimtab.broadcast_optimizer_state, for this context
        train(opt, model, ctx.rank, 2, range(4, 8))
        return [p.detach().clone() for p in model.parameters()]

    expected = reference(name, 8)
    for got in second.run_workers(resume):
        assert max_difference(got, expected) < 1e-5


def test_load_state_dict_on_every_rank_equals_rank0_and_broadcast(cluster_factory) -> None:
    """Every worker loading the same checkpoint gives the same as rank 0 alone plus
    broadcast_optimizer_state (here: Adam's moments and step, betas, amsgrad)."""
    results = []
    for everyone in (False, True):
        cluster = cluster_factory(workers=2, servers=1, chunk_bytes=256)

        def body(ctx: Context, everyone: bool = everyone) -> list[torch.Tensor]:
            model = make_model()
            opt = _wrap(ctx, "adam", model)
            train(opt, model, ctx.rank, 2, range(2))
            state = opt.state_dict()
            opt.param_groups[0]["betas"] = (0.5, 0.5)  # to be undone by the load
            if everyone or ctx.rank == 0:
                opt.load_state_dict(state)
            if not everyone:
                opt.broadcast_state(0)
            assert opt.param_groups[0]["betas"] == (0.8, 0.95)
            train(opt, model, ctx.rank, 2, range(2, 4))
            return [p.detach().clone() for p in model.parameters()]

        results.append(cluster.run_workers(body))
    expected = reference("adam", 4)
    for got in [*results[0], *results[1]]:
        assert max_difference(got, expected) < 1e-5


@pytest.mark.parametrize("recipe", ["clip", "amp"])
def test_gradients_changed_after_synchronize_are_used(cluster_factory, recipe: str) -> None:
    """Horovod's clipping and mixed-precision recipes (synchronize, change .grad, step in
    skip_synchronize) give what one process doing the same with plain torch gives: the
    job switched to summation mode at its first step."""
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)

    def body(ctx: Context) -> list[torch.Tensor]:
        model = make_model()
        opt = _wrap(ctx, "adam", model)
        train(opt, model, ctx.rank, 2, range(5), recipe)
        assert opt.mode.value == "summation"
        return [p.detach().clone() for p in model.parameters()]

    expected = reference("adam", 5, recipe)
    unchanged = reference("adam", 5)
    for got in cluster.run_workers(body):
        assert max_difference(got, expected) < 1e-5
        if recipe == "clip":
            assert max_difference(got, unchanged) > 1e-3  # the clipping did bite


def test_a_plain_script_stays_in_server_mode_and_step_after_synchronize_warns(
    cluster_factory,
) -> None:
    """No synchronize() in the first step: server mode from the second on. step()
    after synchronize() without skip_synchronize() warns as Horovod does and pushes
    nothing twice; a gradient changed after synchronize() in server mode is refused."""
    cluster = cluster_factory(workers=1, servers=1, chunk_bytes=256)

    def body(ctx: Context) -> None:
        model = make_model()
        opt = _wrap(ctx, "sgd", model)
        train(opt, model, 0, 1, range(2))
        assert opt.mode.value == "server"
        before = sum(s["pushes"] for s in ctx.server_stats())
        opt.zero_grad()
        model(torch.randn(3, 10)).sum().backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        assert [str(w.message) for w in caught] == [RESYNC_WARNING]
        chunks = len(ctx.chunks)
        assert sum(s["pushes"] for s in ctx.server_stats()) == before + chunks
        opt.zero_grad()
        model(torch.randn(3, 10)).sum().backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        with pytest.raises(UsageError, match="mode='summation'"), opt.skip_synchronize():
            opt.step()

    cluster.run_workers(body)


def test_a_skipped_step_after_synchronize_applies_nothing(cluster_factory) -> None:
    """GradScaler's skip (synchronize, then no step()): the next step starts cleanly
    and the parameters are those of the steps taken."""
    cluster = cluster_factory(workers=2, servers=1, chunk_bytes=256)

    def body(ctx: Context) -> tuple[int, list[torch.Tensor]]:
        model = make_model()
        opt = _wrap(ctx, "sgd", model)
        train(opt, model, ctx.rank, 2, range(2), "clip")
        snapshot = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        model(torch.randn(3, 10)).sum().backward()
        opt.synchronize()  # ... and step() is skipped
        opt.zero_grad()
        assert max_difference([p.detach() for p in model.parameters()], snapshot) == 0
        return opt.clock, snapshot

    for clock, got in cluster.run_workers(body):
        assert clock == 3
        assert max_difference(got, reference("sgd", 2, "clip")) < 1e-5


@pytest.mark.parametrize(("op", "predivide"), [("Sum", 1.0), (1, 1.0), (None, 4.0)])
def test_sum_and_predivide(cluster_factory, op: object, predivide: float) -> None:
    """op=Sum: the update uses size() x the mean (equal batches: the sum of the
    workers' gradients); gradient_predivide_factor gives the mean again."""
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)

    def body(ctx: Context) -> list[torch.Tensor]:
        model = make_model()
        opt = _wrap(ctx, "sgd", model, op=op, gradient_predivide_factor=predivide)
        train(opt, model, ctx.rank, 2, range(4))
        return [p.detach().clone() for p in model.parameters()]

    summed = reduce_op(op) == "sum"
    model = make_model()
    plain = OPTIMIZERS["sgd"](model.parameters())
    for x, y in global_batches(4):
        plain.zero_grad()
        (loss_of(model, x, y) * (2 if summed else 1)).backward()
        plain.step()
    expected = [p.detach().clone() for p in model.parameters()]
    for got in cluster.run_workers(body):
        assert max_difference(got, expected) < 1e-5


def test_op_names_and_refusals() -> None:
    class Named:
        name = "Sum"

    assert [reduce_op(o) for o in (None, 0, 1, "average", "Op.Sum", Named())] == [
        "average",
        "average",
        "sum",
        "average",
        "sum",
        "sum",
    ]
    with pytest.raises(ConfigError, match="Adasum is not supported"):
        reduce_op(2)
    with pytest.raises(ConfigError, match="Average or Sum"):
        reduce_op("max")
    with pytest.raises(ConfigError, match="op=Average only"):
        trimtab.DistributedOptimizer(
            torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1),
            op="sum",
            gradient_predivide_factor=2.0,
            context=object(),  # type: ignore[arg-type]  (refused before it is used)
        )
