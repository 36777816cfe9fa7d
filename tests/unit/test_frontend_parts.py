"""The front end's pieces without threads or sockets: the step reporter, per-server spans,
a worker's shared-memory slots, the job's terms and the straggler step hook."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest

from trimtab.faults.slowdown import WorkerSlowdown
from trimtab.faults.stragglers import parse_stragglers
from trimtab.frontend.reports import StepReporter, spans_of_step
from trimtab.protocol.messages import Control
from trimtab.roles.worker.context import JobTerms
from trimtab.roles.worker.replies import Reply
from trimtab.transport.shm import SHM_DIR, SlotMap, job_prefix

# -- reports ---------------------------------------------------------------------------


def test_spans_run_from_the_first_push_and_from_the_wait_to_the_last_reply() -> None:
    traffic = {0: [1.0, 4.0, 300.0], 1: [2.5, 3.0, 50.0], 2: [5.0, 5.0, 10.0]}
    assert spans_of_step(traffic, waited=2.0) == [[0, 3.0, 2.0, 300.0], [1, 0.5, 0.5, 50.0]]


class _Client:
    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.sent: list[dict[str, Any]] = []
        self._answers = answers
        self.news: dict[str, Any] | None = None  # a MAP_NEWS the coordinator sent
        self.map_news = self

    def take(self) -> dict[str, Any] | None:  # (as MapNews.take)
        news, self.news = self.news, None
        return news

    def control(self, header: dict[str, Any]) -> concurrent.futures.Future[Reply]:
        self.sent.append(header)
        fut: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        fut.set_result(Reply(self._answers.pop(0), []))
        return fut


class _Context:
    """What a StepReporter uses of a Context: the client, the map, the job's terms."""

    def __init__(self, job: JobTerms, answers: list[dict[str, Any]]) -> None:
        self.job = job
        self.client = _Client(answers)
        self.timeout_s = 1.0
        self.refreshed: list[int] = []
        self.adopted: list[int] = []

    def routing_floor(self) -> int:
        return 3

    def adopt_map(self, news: dict[str, Any]) -> None:
        self.adopted.append(news["epoch"])

    def refresh_map(self, epoch: int) -> None:
        self.refreshed.append(epoch)


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _reporter(ctx: _Context, clock: _Clock) -> StepReporter:
    return StepReporter(ctx, timer=clock, cpu_timer=lambda: clock.t / 2, now=clock)  # type: ignore[arg-type]


def test_a_step_is_reported_with_the_next_steps_first_push() -> None:
    clock = _Clock()
    ctx = _Context(JobTerms(batching="equal"), [{"o": int(Control.OK), "epoch": 1}])
    reporter = _reporter(ctx, clock)
    clock.t += 2.0
    compute, cpu = reporter.compute_so_far(forward_waits=0.5)
    assert (compute, cpu) == (1.5, pytest.approx(1.0 / 1.5))
    traffic = {1: [100.0, 101.0, 64.0]}
    assert reporter.end_step(0, 8, compute, 0.25, 0.5, traffic, waited=100.5) is None
    assert ctx.client.sent == []  # not yet: it leaves with the next step's first push
    reporter.before_push(first=True, clock=1)
    (report,) = ctx.client.sent
    assert report == {
        "o": int(Control.REPORT),
        "k": 0,
        "b": 8,
        "cs": 1.5,
        "ms": 0.25,
        "cpu": 0.5,
        "lo": 3,
        "sv": [[1, 1.0, 0.5, 64.0]],
    }
    reporter.before_push(first=False, clock=1)
    assert len(ctx.client.sent) == 1  # once


def test_reports_are_spaced_by_the_jobs_report_interval() -> None:
    clock = _Clock()
    answers = [{"o": int(Control.OK), "epoch": 1} for _ in range(2)]
    ctx = _Context(JobTerms(report_s=10.0), answers)
    reporter = _reporter(ctx, clock)
    for step in range(4):
        reporter.before_push(first=True, clock=step)
        reporter.end_step(step, 1, 0.1, 0.1, 1.0, {}, waited=clock.t)
        clock.t += 4.0
    # Step 0's left with step 1's push (t=104); the pushes of steps 2 and 3 (t=108,
    # 112) came within 10 s of it, so steps 1 and 2 are never reported.
    assert [h["k"] for h in ctx.client.sent] == [0]
    reporter.before_push(first=True, clock=4)  # t=116: due again, with the last step's
    assert [h["k"] for h in ctx.client.sent] == [0, 3]


def test_lbbsp_sizes_come_back_at_the_end_of_the_next_step() -> None:
    clock = _Clock()
    reply = {"o": int(Control.OK), "epoch": 4, "sizes": [10, 4, 10]}
    ctx = _Context(JobTerms(batching="lbbsp"), [reply])
    reporter = _reporter(ctx, clock)
    assert reporter.end_step(0, 8, 1.0, 0.1, 1.0, {}, waited=clock.t) is None
    reporter.before_push(first=True, clock=1)
    assert reporter.end_step(1, 8, 1.0, 0.1, 1.0, {}, waited=clock.t) == [10, 4, 10]
    assert ctx.refreshed == [4]  # the map the sizes were decided with


def test_a_saps_directive_makes_a_lagging_worker_skip_its_step() -> None:
    clock = _Clock()
    directive = {"o": int(Control.OK), "epoch": 2, "refresh": True, "lead": 7}
    ctx = _Context(JobTerms(consistency="saps"), [directive])
    reporter = _reporter(ctx, clock)
    reporter.end_step(0, 1, 1.0, 0.1, 1.0, {}, waited=clock.t)
    reporter.before_push(first=True, clock=1)  # sends the report; its answer is in
    assert not reporter.skipping  # read at the next step's first push
    reporter.end_step(1, 1, 1.0, 0.1, 1.0, {}, waited=clock.t)
    ctx.client._answers.append({"o": int(Control.OK), "epoch": 2})
    reporter.before_push(first=True, clock=2)
    assert reporter.skipping and reporter.lead == 7
    assert ctx.refreshed == [2]


# -- the job's terms ----------------------------------------------------------------


def test_job_terms_from_a_declare_reply() -> None:
    assert JobTerms.from_reply({}) == JobTerms()
    terms = JobTerms.from_reply({"batching": "lbbsp", "report_s": 2, "time_servers": 1})
    assert terms == JobTerms(batching="lbbsp", report_s=2.0, time_servers=True)
    assert terms.sizes_batches and not JobTerms().sizes_batches
    with pytest.raises(AttributeError):
        terms.batching = "equal"  # type: ignore[misc]


# -- shared-memory slots ----------------------------------------------------------------

LOCAL, REMOTE = "tcp://127.0.0.1:5000", "tcp://10.1.2.3:5000"


def _slot_map(job: str, enabled: bool = True) -> SlotMap:
    # Chunk 0 fits in a header; chunks 1 and 2 get slots, 2 aligned to 64 bytes.
    return SlotMap.create(
        job, "w0", [(0, 100), (1, 1000), (2, 600)], min_bytes=512, enabled=enabled
    )


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")
def test_slots_carry_big_pushes_to_local_servers_only() -> None:
    job = f"slots{time.monotonic_ns()}"
    slots = _slot_map(job)
    try:
        assert slots.arena is not None
        assert slots.slots == {1: (0, 1000), 2: (1024, 600)}
        data = memoryview(bytes(range(200)) * 3)
        assert slots.write(slots.slots[2], LOCAL, data) == [slots.arena.name, 1024, 600]
        assert bytes(slots.arena.view(1024, 600)) == bytes(data)
        assert slots.write(slots.slots[2], REMOTE, data) is None  # another machine
        assert slots.write(slots.slots[1], LOCAL, data[:500]) is None  # fits in a header
        assert slots.value(2, 600) is not None and slots.value(2, 601) is None
        assert slots.value(0, 10) is None  # no slot
        # A server that cannot map the arena gets the refused bytes, and bytes from then on.
        assert bytes(slots.refused(LOCAL, 1024, 600)) == bytes(data)
        assert slots.write(slots.slots[2], LOCAL, data) is None
    finally:
        slots.close()
    assert list(SHM_DIR.glob(job_prefix(job) + "*")) == []
    assert slots.arena is None and slots.slots == {}
    slots.close()  # idempotent


def test_slots_turned_off_send_everything_inline() -> None:
    slots = _slot_map(f"off{time.monotonic_ns()}", enabled=False)
    assert slots.arena is None and slots.slots == {}
    assert slots.value(1, 10) is None
    assert not slots.shares(LOCAL)


# -- the straggler step hook ----------------------------------------------------------


def test_an_emulated_straggler_sleeps_and_reports_the_longer_compute() -> None:
    hook = WorkerSlowdown(parse_stragglers("worker:0:slowdown=3@1-2"), rank=0)
    assert hook(0, 0.01) == 0.01  # before its window: untouched
    started = time.monotonic()
    assert hook(1, 0.01) == pytest.approx(0.03)
    assert time.monotonic() - started >= 0.02  # slept the difference (sleep never is short)
    assert hook(2, 0.01) == 0.01
