"""The coordinator's event stream and what reads it: the ring buffer itself, the events
a real (in-process) job emits, the Prometheus metrics and the run record kept from
them."""

from __future__ import annotations

import json

import pytest

from tests.equivalence_job import Setup, train_worker
from trimtab.observe.records import RunRecord, read_events
from trimtab.observe.state import JobState
from trimtab.roles.coordinator.events import Events


def test_the_ring_keeps_the_newest_events_in_order_and_listeners_see_every_one() -> None:
    events = Events(capacity=5)
    seen: list[int] = []
    events.listen(lambda e: seen.append(e["seq"]))
    for i in range(12):
        events.emit("refused", code="malformed", msg=str(i))
    assert events.seq == 12
    assert seen == list(range(1, 13))
    assert [e["seq"] for e in events.since(0)] == [8, 9, 10, 11, 12]
    assert [e["seq"] for e in events.since(10)] == [11, 12]
    assert events.since(12) == []
    assert [e["seq"] for e in events.since(7, limit=2)] == [8, 9]
    replayed: list[int] = []
    events.listen(lambda e: replayed.append(e["seq"]), replay=True)
    events.emit("end", why=None)
    assert replayed == [8, 9, 10, 11, 12, 13]
    with pytest.raises(ValueError, match="no event kind"):
        events.emit("nonsense")


def test_a_failing_listener_is_dropped_and_the_stream_goes_on() -> None:
    events = Events()
    calls: list[int] = []

    def bad(e: dict) -> None:
        calls.append(e["seq"])
        raise RuntimeError("boom")

    events.listen(bad)
    events.emit("end", why=None)
    events.emit("end", why=None)
    assert calls == [1]
    assert events.seq == 2


@pytest.fixture(scope="module")
def job_events(tmp_path_factory) -> list[dict]:
    """The events of a 2 x 2 job (in one process) with LB-BSP and a forced migration
    every 2 steps, as its run record holds them."""
    from tests.conftest import Cluster

    setup = Setup("sgd", (8, 8), steps=6)
    cluster = Cluster(2, 2, "inproc", chunk_bytes=256, batching="lbbsp", rebalance_every=2)
    state = JobState()
    directory = tmp_path_factory.mktemp("runs") / cluster.job
    record = RunRecord(directory, state)
    cluster.coordinator.events.listen(state, replay=True)
    cluster.coordinator.events.listen(record, replay=True)
    try:
        cluster.run_workers(lambda ctx: train_worker(setup, ctx.rank, ctx))
    finally:
        cluster.close()
        record.close()
    assert json.loads((directory / "summary.json").read_text())["steps"] == 12
    return read_events(directory)


def test_a_job_emits_its_steps_members_placements_migrations_and_batch_sizes(job_events) -> None:
    kinds = [e["kind"] for e in job_events]
    assert kinds[0] == "job" and kinds[-1] == "end"
    steps = [e for e in job_events if e["kind"] == "step"]
    assert sorted((e["rank"], e["clock"]) for e in steps) == [
        (r, k) for r in range(2) for k in range(6)
    ]
    assert all(e["compute_s"] > 0 and e["comm_s"] >= 0 and e["batch"] > 0 for e in steps)
    members = {(e["role"], e["rank"], e["state"]) for e in job_events if e["kind"] == "member"}
    assert {("server", 0, "joined"), ("server", 1, "joined")} <= members
    assert {("worker", 0, "done"), ("worker", 1, "done")} <= members
    placements = [e for e in job_events if e["kind"] == "placement"]
    epochs = [e["epoch"] for e in placements]
    assert epochs == sorted(epochs) and len(epochs) >= 2
    for e in placements:  # per server: chunks and bytes agree with the owners
        assert e["chunks"] == [e["owners"].count(s) for s in range(2)]
        assert sum(e["chunks"]) == len(e["owners"]) and sum(e["bytes"]) > 0
    migrations = [(e["phase"], e["epoch"]) for e in job_events if e["kind"] == "migration"]
    started = [ep for phase, ep in migrations if phase == "start"]
    done = [ep for phase, ep in migrations if phase == "done"]
    assert done and done in (started, started[:-1])  # the last may start as the job ends
    assert set(done) <= set(epochs)  # each finished migration's map was published
    sizes = [e["sizes"] for e in job_events if e["kind"] == "batch_sizes"]
    assert sizes and all(sum(s) == 16 for s in sizes)
    assert [e["seq"] for e in job_events] == list(range(1, len(job_events) + 1))


def test_the_metrics_follow_the_events(job_events) -> None:
    from trimtab.observe.metrics import METRICS, Metrics

    metrics = Metrics()
    for e in job_events:
        metrics(e)
    text = metrics.exposition().decode()
    for name, kind, _ in METRICS:
        assert f"# TYPE {name} {kind}" in text, name
    value = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    migrations = sum(e["kind"] == "migration" and e["phase"] == "done" for e in job_events)
    assert value["trimtab_migrations_total"] == migrations > 0
    assert value["trimtab_steps_total"] == 12
    assert value["trimtab_samples_total"] == 6 * 16
    assert value["trimtab_step_duration_seconds_count"] == 12
    assert value['trimtab_worker_clock{worker="1"}'] == 6
    last = [e for e in job_events if e["kind"] == "placement"][-1]
    assert value["trimtab_placement_epoch"] == last["epoch"]
    assert value['trimtab_server_chunks{server="0"}'] == last["chunks"][0]
    assert value["trimtab_live_workers"] == 0  # both done


def test_a_users_torch_profile_shows_trimtabs_phases(cluster_factory) -> None:
    import torch

    import trimtab

    cluster = cluster_factory(workers=1, servers=1)

    def body(ctx) -> set[str]:
        model = torch.nn.Linear(4, 2)
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                model(torch.ones(2, 4)).sum().backward()
                opt.synchronize()
                with opt.skip_synchronize():
                    opt.step()
                opt.zero_grad()
        return {e.key for e in prof.key_averages()}

    (names,) = cluster.run_workers(body)
    assert {"trimtab.step", "trimtab.synchronize", "trimtab.push", "trimtab.wait"} <= names
