"""A worker sends one step report per step however many DistributedOptimizers it holds:
only the first optimizer's (table 0) reports, so the coordinator's per-clock logic
(LB-BSP's wait for every worker's report, the straggler detector, PSLD's traffic) sees
one report per worker and clock, and LB-BSP's sizes arrive at the first optimizer. And
the report of a closing optimizer's last step is sent at once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import trimtab
from tests.unit.test_frontend_parts import _Clock, _Context
from trimtab.frontend.reports import StepReporter
from trimtab.protocol.messages import Control
from trimtab.roles.coordinator.steps import Steps
from trimtab.roles.worker.context import Context, JobTerms

OK = {"o": int(Control.OK), "epoch": 1}


def test_a_second_optimizer_s_reporter_keeps_time_and_sends_the_first_s_report() -> None:
    clock = _Clock()
    ctx = _Context(JobTerms(), [dict(OK) for _ in range(3)])
    first = StepReporter(ctx, timer=clock, cpu_timer=clock, now=clock)  # type: ignore[arg-type]
    quiet = StepReporter(ctx, sender=first, timer=clock, cpu_timer=clock, now=clock)  # type: ignore[arg-type]
    for step in range(3):
        # A GAN's iteration: the second optimizer (the discriminator) steps first.
        quiet.before_push(first=True, clock=step)
        assert [h["k"] for h in ctx.client.sent] == list(range(step))  # the last step's
        quiet.before_push(first=False, clock=step)
        clock.t += 2.0
        assert quiet.compute_so_far(0.0)[0] == 2.0  # timed from its last step's end
        assert quiet.end_step(step, 8, 2.0, 0.1, 1.0, {0: [1.0, 2.0, 8.0]}, clock.t) is None
        first.before_push(first=True, clock=step)
        first.end_step(step, 8, 1.0, 0.1, 1.0, {}, waited=clock.t)
    quiet.flush()
    assert [h["k"] for h in ctx.client.sent] == [0, 1]  # the first optimizer's steps only
    first.flush()
    assert [h["k"] for h in ctx.client.sent] == [0, 1, 2]


def test_a_closing_reporter_sends_its_last_step_at_once() -> None:
    clock = _Clock()
    ctx = _Context(JobTerms(report_s=10.0), [dict(OK), dict(OK)])
    reporter = StepReporter(ctx, timer=clock, cpu_timer=clock, now=clock)  # type: ignore[arg-type]
    for step in range(3):
        reporter.before_push(first=True, clock=step)
        reporter.end_step(step, 1, 0.1, 0.1, 1.0, {}, waited=clock.t)
    # Step 0 left with step 1's push; steps 1 and 2 were not due (report_s).
    assert [h["k"] for h in ctx.client.sent] == [0]
    reporter.flush()  # the optimizer closes (shutdown()): its clock must be known
    assert [h["k"] for h in ctx.client.sent] == [0, 2]
    reporter.flush()
    assert len(ctx.client.sent) == 2  # once


STEPS = 4


def _two_optimizers(ctx: Context) -> tuple[Any, Any, Any, Any]:
    gen, disc = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    opt_g = trimtab.DistributedOptimizer(
        torch.optim.SGD(gen.parameters(), lr=0.1), gen.named_parameters(), context=ctx
    )
    opt_d = trimtab.DistributedOptimizer(
        torch.optim.Adam(disc.parameters(), lr=0.01), disc.named_parameters(), context=ctx
    )
    return gen, disc, opt_g, opt_d


def test_lbbsp_with_two_optimizers_takes_one_report_per_worker_and_step(
    cluster_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports: list[tuple[int, int]] = []
    lock = threading.Lock()
    record = Steps.record

    def counted(self: Steps, member: Any, header: Any) -> Any:
        with lock:
            reports.append((member.rank, header["k"]))
        return record(self, member, header)

    monkeypatch.setattr(Steps, "record", counted)
    cluster = cluster_factory(workers=2, servers=1, batching="lbbsp")

    def body(ctx: Context) -> tuple[list[int] | None, list[int] | None]:
        gen, disc, opt_g, opt_d = _two_optimizers(ctx)
        x = torch.ones(4, 3) * (ctx.rank + 1)
        for _ in range(STEPS):
            # The iteration's sizes are the first optimizer's; the second takes them too.
            if opt_g.batch_sizes is not None:
                opt_d.batch_size = opt_g.batch_sizes[ctx.rank]
            for opt in (opt_g, opt_d):
                opt.zero_grad()
            disc(gen(x)).sum().backward()
            opt_d.step()
            opt_g.step()
        return opt_g.batch_sizes, opt_d.batch_sizes

    results = cluster.run_workers(body)
    # Every step of every worker reported exactly once (the last when it closed).
    assert sorted(reports) == [(r, k) for r in range(2) for k in range(STEPS)]
    for sizes_g, sizes_d in results:
        # LB-BSP split the global batch (each worker's batch_size 1: 2) between them.
        assert sizes_g == [1, 1]
        assert sizes_d is None  # the second optimizer neither reports nor is sized
