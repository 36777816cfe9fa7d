"""``trimtab.shutdown()`` then ``trimtab.init()`` in one script: the worker LEAVEs (it
keeps its rank and the job goes on), registers again under its rank, and its optimizer
built again over the same parameters goes on from the servers' values and state and
from its clock. The coordinator's states without sockets, then whole jobs in one
process (the in-process fabric)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

import trimtab
from tests.equivalence_job import (
    Setup,
    global_batches,
    loss_of,
    make_model,
    make_optimizer,
    max_difference,
    reference,
)
from tests.unit.test_coordinator_members import code_of, job
from tests.unit.test_coordinator_migration import TERMS, register
from tests.unit.test_tables import ADAM, GEN, SGD, declare
from trimtab.errors import ProtocolError, RemoteError
from trimtab.policies.placement import PLACEMENTS
from trimtab.protocol import headers as h
from trimtab.protocol.messages import Control
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members, MemberState
from trimtab.roles.worker.context import Context


def again(rank: int) -> dict[str, Any]:
    return {"o": int(Control.REGISTER), "i": 1, "role": "worker", "rank": rank}


# -- the coordinator's members -------------------------------------------------------


def test_a_worker_that_left_keeps_its_rank_is_watched_and_comes_back_with_its_clocks() -> None:
    members = job()
    w0, w1 = members.workers[0], members.workers[1]
    w0.floor = 2
    members.worker_left(w0, [5, 3])
    assert w0.state is MemberState.LEFT and w0.clocks == [5, 3]
    assert not w0.finished  # its process keeps a connection: a silent one is dead
    w0.last_seen -= 100
    assert members.silent(time.monotonic(), 30.0) is w0
    members.worker_left(w0, [6, 3])  # a repeated LEAVE only updates the clocks
    assert w0.clocks == [6, 3]
    # Its rank is its own: an unnamed rank does not take it, a named one does.
    with pytest.raises(ProtocolError, match="no worker rank free"):
        members.register(b"auto", {"o": 1, "i": 1, "role": "worker", "rank": -1}, running=True)
    with pytest.raises(ProtocolError, match="rank 1 is taken") as taken:
        members.register(b"new", again(1), running=True)  # worker 1 is still active
    assert code_of(taken) == "bad_state"
    back = members.register(b"new", again(0), running=True)
    assert back.state is MemberState.ACTIVE and (back.floor, back.clocks) == (2, [6, 3])
    assert members.workers[0] is back and b"w0" not in members.by_peer
    assert not members.worker_done(w1)  # worker 0 is back, and active
    assert members.worker_done(back)


def test_the_job_ends_at_the_last_done_not_at_the_last_leave() -> None:
    members = job()
    w0, w1 = members.workers[0], members.workers[1]
    members.worker_left(w0, [3])
    members.worker_left(w1, [3])
    assert not members.worker_done(w0)  # LEFT -> DONE: its process ended
    assert w0.state is MemberState.DONE and w0.finished
    assert members.worker_done(w1)  # every worker's process ended: the job is over
    with pytest.raises(ProtocolError, match="cannot go from done to left") as e:
        members.worker_left(w0, [3])
    assert code_of(e) == "bad_state"
    with pytest.raises(ProtocolError, match="only workers leave"):
        members.worker_left(members.servers[0], [])


def test_a_left_worker_does_not_hold_back_a_drained_server() -> None:
    members = job(servers=2)
    members.placed([0, 1])
    members.drain(members.servers[1])
    members.workers[0].floor = members.workers[1].floor = 1
    members.worker_left(members.workers[0], [4])  # its floor stays at map 1
    members.workers[1].floor = 2
    out = members.retire_empty(owners=[0, 0], epoch=2)
    assert [m.header["o"] for m in out] == [int(Control.SHUTDOWN)]
    assert members.servers[1].state is MemberState.RETIRED


# -- the coordinator's tables ----------------------------------------------------------


def placed() -> tuple[Members, Maps]:
    """A job of 2 workers and 2 servers whose table 0 (GEN under Adam) is placed."""
    members = Members(2, 2, 2)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    for w in range(2):
        declare(maps, members, w, GEN, ADAM, 0)
    for s in range(2):
        maps.ack(s, members)
    return members, maps


def test_a_table_declared_again_is_answered_at_once_with_the_map_and_the_clock() -> None:
    members, maps = placed()
    w0 = members.workers[0]
    header = {**h.declare(tensors=GEN, opt=ADAM), "i": 77}
    asked: list[int] = []
    out = maps.again(w0, header, members, lambda t: asked.append(t) or 12)
    (reply,) = out
    assert reply.peer == b"w0" and asked == [0]
    assert reply.header["i"] == 77 and reply.header["k"] == 12
    assert reply.header["epoch"] == maps.epoch and reply.header["tensors"] == GEN
    assert w0.floor == maps.epoch
    assert not maps.pending and maps.place(members) == []  # nothing placed again
    # Its hyperparameters may differ (they travel with the pushes), not its class.
    other = {**ADAM, "groups": [{"lr": 0.5, "betas": [0.5, 0.999]}]}
    assert maps.again(w0, {**h.declare(tensors=GEN, opt=other), "i": 1}, members, lambda t: 0)
    # A table the job does not have yet goes the usual way (declare and place).
    new = {**h.declare(tensors=GEN, opt=SGD, table=1), "i": 2}
    assert maps.again(w0, new, members, lambda t: 0) == []


@pytest.mark.parametrize(
    ("tensors", "opt", "says"),
    [
        (GEN[:1], ADAM, "differ from the job's (the job's vs its: 2 tensors vs 1)"),
        (GEN, {**ADAM, "cls": "SGD"}, "it runs SGD in server mode, the job's runs Adam"),
        (GEN, {**ADAM, "mode": "summation"}, "in summation mode, the job's runs Adam in server"),
    ],
)
def test_a_table_declared_again_differently_is_refused(
    tensors: list[Any], opt: dict[str, Any], says: str
) -> None:
    members, maps = placed()
    with pytest.raises(ProtocolError, match="built its optimizer number 0") as e:
        maps.again(
            members.workers[1],
            {**h.declare(tensors=tensors, opt=opt), "i": 1},
            members,
            lambda t: 0,
        )
    assert code_of(e) == "bad_state" and says in str(e.value)


# -- whole jobs in one process -----------------------------------------------------------

STEPS, FIRST = 6, 3  # steps in all; those before the re-init


def _train(opt: trimtab.DistributedOptimizer, model: torch.nn.Module, steps: range) -> None:
    batches = global_batches(STEPS)
    for step in steps:
        x, y = batches[step]
        lo = 12 * opt._ctx.rank
        opt.batch_size = 12
        opt.zero_grad()
        loss_of(model, x[lo : lo + 12], y[lo : lo + 12]).backward()
        opt.step()


def _optimizer(model: torch.nn.Module, ctx: Context) -> trimtab.DistributedOptimizer:
    inner = make_optimizer("sgd", model)  # momentum: its state lives on the servers
    return trimtab.DistributedOptimizer(inner, model.named_parameters(), context=ctx)


def _reinit(cluster: Any, ctx: Context) -> Context:
    """What ``shutdown()`` then ``init()`` do to a worker's context."""
    ctx.leave()
    back = cluster.context(ctx.rank)
    back.take_over(ctx)
    ctx.close(done=False)
    return back


@pytest.mark.parametrize("everyone", [True, False], ids=["every-worker", "one-worker"])
def test_training_goes_on_after_a_reinit_as_if_never_stopped(
    cluster_factory: Any, everyone: bool
) -> None:
    """SGD with momentum (state on the servers): the parameters after 3 steps, a re-init
    and 3 more equal one process's 6 steps, whether every worker re-initialised or only
    worker 0 (whose own copy was spoiled meanwhile: it takes the servers' values)."""
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256)
    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        ctx = cluster.context(rank)
        try:
            model = make_model(42 if rank == 0 else 1000 + rank)
            opt = _optimizer(model, ctx)
            _train(opt, model, range(FIRST))
            if everyone or rank == 0:
                ctx = _reinit(cluster, ctx)
                with torch.no_grad():
                    for p in model.parameters():
                        p.zero_()
                opt = _optimizer(model, ctx)
                assert opt.clock == FIRST
            _train(opt, model, range(FIRST, STEPS))
            assert opt.clock == STEPS
            ctx.barrier()
            results[rank] = [p.detach().clone() for p in model.parameters()]
        except BaseException as exc:
            errors.append(exc)
            cluster.coordinator.abort(f"worker {rank}: {exc!r}")
        finally:
            ctx.close()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    expected = reference(Setup("sgd", (12, 12), steps=STEPS))
    for got in results:
        assert max_difference(got, expected) < 1e-5


def test_a_job_whose_workers_all_left_runs_until_their_processes_end(cluster_factory) -> None:
    cluster = cluster_factory(workers=2, servers=1)
    contexts = [cluster.context(0), cluster.context(1)]
    for ctx in contexts:
        ctx.leave()
    status = h.read_status_reply(contexts[0].call(h.status_request()).header)
    assert status["left"] == [0, 1] and status["done"] == []  # the job still runs
    contexts[0].close()
    assert cluster.coordinator.status()["done"] == [0]
    contexts[1].close()
    cluster.threads[0].join(10)
    assert not cluster.threads[0].is_alive()  # the last DONE ended the job


def test_a_worker_that_left_and_died_ends_the_job(cluster_factory) -> None:
    # Every node heartbeats each second: only a dead one is silent for 2.5 s.
    cluster = cluster_factory(workers=2, servers=1, dead_after_s=2.5)
    gone, other = cluster.context(0), cluster.context(1)
    gone.leave()
    gone.client.close(done=False)  # its process died: no DONE, no more heartbeats
    deadline = time.monotonic() + 20
    while other.client.dead is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert other.client.dead is not None
    assert "worker 0 was lost: it has been silent" in other.client.dead
    other.client.close(done=False)


def test_a_worker_that_left_takes_the_collectives_again_when_back(cluster_factory) -> None:
    """A collective waits for a worker that left (it may come back), is answered once it
    is back, and is refused once its process ends."""
    cluster = cluster_factory(workers=2, servers=1)
    w0, w1 = cluster.context(0), cluster.context(1)
    w0.leave()
    waiting = w1.gather("g", "sig", {"x": 1})
    time.sleep(0.2)
    assert not waiting.done()
    back = cluster.context(0)
    back.take_over(w0)
    w0.close(done=False)
    got = back.gathered(back.gather("g", "sig", {"x": 0}))
    assert got.metas == [{"x": 0}, {"x": 1}]
    assert w1.gathered(waiting).metas == [{"x": 0}, {"x": 1}]
    back.close()  # its process ended: the next collective cannot complete
    with pytest.raises(RemoteError, match="left the job") as e:
        w1.gathered(w1.gather("h", "sig", {}))
    assert e.value.code == "bad_state"
    w1.close()
