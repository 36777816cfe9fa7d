"""Elastic workers as pure operations: the coordinator's step boundary, a lost worker,
a joining one, the batch-sizing state; the server's rounds when the worker set shrinks;
the sampler over a changing set; the WORKERS headers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trimtab.data import BalancedSampler, processed_samples
from trimtab.errors import ConfigError, ProtocolError
from trimtab.policies.batching import BATCHING
from trimtab.policies.detection import DEFAULT_DETECTOR, DETECTORS
from trimtab.protocol import elastic as el
from trimtab.protocol.messages import Control, ErrorCode
from trimtab.roles.coordinator.elastic import Elastic, WorkerSet
from trimtab.roles.coordinator.members import Member, Members, MemberState
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.roles.coordinator.steps import Steps


def report(clock: int, batch: int) -> dict[str, Any]:
    header = {"o": int(Control.REPORT), "i": 30 + clock, "k": clock, "b": batch}
    return {**header, "cs": 0.1, "ms": 0.01, "cpu": 1.0}


class Job:
    """Members (``n`` workers, 2 servers), steps and the elastic part of one job."""

    def __init__(self, n: int, min_workers: int = 1, batching: str = "equal") -> None:
        self.members = Members(n, 2, 2)
        self.members.joins = True
        self.members.max_workers = n + 2
        for w in range(n):
            self.register_worker(w, running=False)
        for s in range(2):
            self.members.register(
                b"s%d" % s, {"o": 1, "i": 1, "role": "server", "addr": f"a{s}"}, running=False
            )
        self.steps = Steps(
            n, BATCHING.create(batching), DETECTORS.create(DEFAULT_DETECTOR), skips_stragglers=False
        )
        self.declared: list[tuple[int, int]] = []  # (rank, clock) answered again
        self.told: list[list[int]] = []  # the ranks taking part, as each change said them
        self.elastic = Elastic(
            self.members,
            self.steps,
            BATCHING.create(batching),
            min_workers=min_workers,
            synchronous=True,
            epoch=lambda: 7,
            again=self.again,
            ranks_changed=self.told.append,
        )

    def register_worker(self, rank: int, running: bool = True) -> Member:
        header = {"o": 1, "i": 1, "role": "worker", "rank": rank}
        peer = b"w%d" % (rank if rank >= 0 else len(self.members.workers))
        return self.members.register(peer, header, running=running)

    def again(self, member: Member, header: dict[str, Any]) -> Outbox:
        clock = self.steps.clocks[member.rank]
        self.declared.append((member.rank, clock))
        return [Send(member.peer, {"o": int(Control.MAP), "i": header["i"], "k": clock})]

    def report(self, rank: int, clock: int, batch: int) -> Outbox:
        member = self.members.workers[rank]
        c, sample = self.steps.record(member, report(clock, batch))
        return self.elastic.report(member, 30 + clock, c, sample)


def sizes_of(out: Outbox) -> dict[bytes, list[int]]:
    return {
        m.peer: m.header["sizes"]  # type: ignore[typeddict-item]
        for m in out
        if isinstance(m, Send) and "sizes" in m.header
    }


def test_the_step_boundary_answers_every_worker_once_all_reported() -> None:
    job = Job(3)
    assert job.report(0, 0, 8) == [] and job.report(1, 0, 8) == []
    out = job.report(2, 0, 8)
    assert sizes_of(out) == {b"w0": [8, 8, 8], b"w1": [8, 8, 8], b"w2": [8, 8, 8]}
    assert all(m.header["epoch"] == 7 for m in out if isinstance(m, Send))
    assert job.elastic.state.global_batch == 24


def test_a_lost_worker_is_dropped_the_servers_told_and_its_share_split() -> None:
    job = Job(3)
    for r in range(3):
        job.report(r, 0, 8)
    job.report(0, 1, 8)
    job.report(1, 1, 8)  # worker 2 dies during step 1
    out, fatal = job.elastic.lost(job.members.workers[2], "has been silent for 5s")
    assert fatal is None
    assert job.members.workers[2].state is MemberState.LOST
    told = [m for m in out if isinstance(m, Send) and m.header["o"] == int(Control.WORKERS)]
    assert [(m.peer, m.header["ws"]) for m in told] == [(b"s0", [0, 1]), (b"s1", [0, 1])]
    # The boundary worker 2 held back completes: the same global batch over two.
    assert sizes_of(out) == {b"w0": [12, 12, 0], b"w1": [12, 12, 0]}
    assert job.steps.num_workers == 2 and job.steps.job_clock == 2
    assert job.members.taking_part() == [0, 1]
    # ... and the job map (through the coordinator's Maps.take_part): a server that
    # joins later must not wait for worker 2's pushes.
    assert job.told == [[0, 1]]


def test_below_min_workers_the_job_must_end_and_says_why() -> None:
    job = Job(2, min_workers=2)
    out, fatal = job.elastic.lost(job.members.workers[1], "has been silent for 5s")
    assert out == [] and fatal is not None
    assert "below --min-workers 2" in fatal and "worker 1" in fatal


def test_a_new_worker_is_held_until_the_boundary_and_the_servers_acknowledged() -> None:
    job = Job(2)
    new = job.register_worker(-1)
    assert new.rank == 2 and job.elastic.joining(new)
    assert job.elastic.hold(new, {"o": int(Control.DECLARE), "i": 5}) == []
    assert job.elastic.held == [2]
    job.report(0, 3, 12)
    out = job.report(1, 3, 12)
    # First the servers learn the new set; nobody is answered yet.
    assert [(m.peer, m.header["ws"]) for m in out if isinstance(m, Send)] == [
        (b"s0", [0, 1, 2]),
        (b"s1", [0, 1, 2]),
    ]
    g = job.elastic.state.generation
    assert job.elastic.on_ack(0, dict(el.workers_ack(generation=g))) == []
    assert job.elastic.on_ack(1, dict(el.workers_ack(generation=g - 1))) == []  # stale
    released = job.elastic.on_ack(1, dict(el.workers_ack(generation=g)))
    assert sizes_of(released) == {b"w0": [8, 8, 8], b"w1": [8, 8, 8], b"w2": [8, 8, 8]}
    assert job.declared == [(2, 4)]  # it goes on from the next step
    assert job.steps.num_workers == 3 and not job.elastic.joining(new)


def test_a_join_is_refused_unless_the_job_may_grow() -> None:
    job = Job(2)
    job.members.joins = False
    with pytest.raises(ProtocolError):
        job.register_worker(-1)


def test_the_batch_state_round_trips_through_a_dict() -> None:
    state = WorkerSet(ranks=[0, 2], global_batch=24, sizes={0: 10, 2: 14}, generation=3, slots=3)
    assert WorkerSet.from_dict(state.to_dict()) == state
    assert state.vector() == [10, 0, 14]


def test_the_server_completes_rounds_that_waited_only_for_a_lost_worker() -> None:
    from tests.unit.test_server_store import push, store_of  # the store's own helpers

    store = store_of(owners=[0, 0], workers=[0, 1, 2])  # summation: replies are means
    assert push(store, 0, [1, 1, 1, 1], w=4) == []
    assert push(store, 1, [4, 4, 4, 4], w=12) == []
    assert push(store, 0, [2, 2, 2, 2], chunk=1, w=4) == []
    replies = store.set_workers([0, 1])
    # Chunk 0's round is complete without worker 2: the mean over the samples that
    # arrived, (4 * 1 + 12 * 4) / 16. Chunk 1 still waits for worker 1.
    assert [r.chunk.spec.id for r in replies] == [0, 0]
    assert torch.allclose(replies[0].value, torch.full((4,), 52 / 16))
    assert len(push(store, 1, [6, 6, 6, 6], chunk=1, w=12)) == 2
    assert store.workers == {0, 1}
    with pytest.raises(ProtocolError, match="not in this job"):
        push(store, 2, [1, 1, 1, 1], chunk=0, clock=1, w=4)


def test_the_sampler_follows_sizes_of_a_changing_set_and_records_each_step(
    tmp_path: Path,
) -> None:
    class Opt:
        batch_sizes: list[int] | None = None
        batch_size = 1.0
        clock = 0

    opt = Opt()
    sampler = BalancedSampler(48, 12, opt, rank=1, size=3, seed=1, record=tmp_path)
    it = iter(sampler)
    first = next(it)
    assert len(first) == 4
    opt.batch_sizes = [6, 6, 0]  # rank 2 was lost: the same global batch over two
    second = next(it)
    assert len(second) == 6 and opt.batch_size == 6
    next(it)  # step 1 is over: recorded
    assert processed_samples(tmp_path) == {0: first, 1: second}
    opt.batch_sizes = [6, 6]
    with pytest.raises(ConfigError):
        opt.batch_sizes = [6, 5]
        next(it)


def test_a_joiner_s_sampler_starts_at_the_job_s_step() -> None:
    class Opt:
        batch_sizes: list[int] | None = [4, 4, 4]
        batch_size = 1.0
        clock = 6

    sampler = BalancedSampler(48, 12, Opt(), rank=2, size=2, seed=1)
    assert sampler.start_epoch == 1
    sampler.set_epoch(1)
    assert len(list(sampler)) == 2  # steps 6 and 7 of the job: 4 steps an epoch


@pytest.mark.parametrize(
    "bad",
    [
        {"g": 1, "ws": []},
        {"g": 1, "ws": [0, 0]},
        {"g": 1, "ws": [-1]},
        {"g": "1", "ws": [0]},
        {"g": 1, "ws": list(range(el.MAX_WORKERS + 1))},
        {"g": 1, "ws": [True]},
    ],
)
def test_a_malformed_workers_header_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as err:
        el.read_workers({"o": int(Control.WORKERS), **bad})
    assert err.value.args[0] == ErrorCode.MALFORMED.value


def test_the_elastic_headers_read_what_they_built() -> None:
    assert el.read_workers(dict(el.workers(generation=2, ranks=[3, 1])))["ws"] == [1, 3]
    assert el.read_scale_workers(dict(el.scale_workers(workers=4)))["workers"] == 4
    assert el.read_scale_workers_reply(dict(el.scale_workers_reply(rid=1, target=3)))["target"] == 3


def test_a_joiner_lost_before_it_took_part_changes_nothing_else() -> None:
    job = Job(2)
    new = job.register_worker(-1)
    job.elastic.hold(new, {"o": int(Control.DECLARE), "i": 5})
    out, fatal = job.elastic.lost(new, "has been silent for 5s")
    assert (out, fatal, job.elastic.held) == ([], None, [])
    assert job.steps.num_workers == 2 and job.members.taking_part() == [0, 1]
    job.report(0, 0, 12)
    assert sizes_of(job.report(1, 0, 12)) == {b"w0": [12, 12, 0], b"w1": [12, 12, 0]}
