"""What a worker tells the coordinator about its steps, and what it hears back.

At the end of each step an optimizer's :class:`StepReporter` holds the step's
measurements (compute and communication seconds, CPU share, per-server traffic spans);
they leave as a REPORT with the next step's first push, so that the coordinator hears
from every worker when their gradients are ready (BSP's synchronisation point anyway).
The coordinator answers with every worker's next batch size (LB-BSP: the worker waits
for it at the end of the next step) or, under SaPS, with a directive read at a step's
first push: refresh the map, and maybe skip this step's stale gradient to catch up.

A worker sends one REPORT per step, whatever the number of its optimizers: only the
first optimizer's reporter (table 0) reports; the others keep time only, and their
step's first push sends the first one's report when due (the worker's next iteration
began: a GAN's discriminator steps before its generator, declared first). The
coordinator's per-step logic (LB-BSP's wait for every worker's report of a clock, the
straggler detector, PSLD's traffic of a step) counts one report per worker and clock.
Under LB-BSP the sizes therefore arrive at the first optimizer (its ``batch_sizes``):
they are the iteration's, and a script with several optimizers sets each one's
``batch_size`` from them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Mapping

from trimtab.protocol import headers
from trimtab.roles.worker.client import wait
from trimtab.roles.worker.context import Context
from trimtab.roles.worker.replies import Reply

#: One step's measurements: clock, batch size, compute seconds, communication seconds,
#: CPU share, per-server spans.
_Report = tuple[int, int, float, float, float, list[list[float]]]


def spans_of_step(traffic: Mapping[int, list[float]], waited: float) -> list[list[float]]:
    """Per server a step pushed to (``traffic``: ``server -> [first push sent, last
    reply read, bytes both ways]``): ``[server, seconds from the first push sent to the
    last reply read, seconds from the later of that push and the start of the wait
    (``waited``) to that reply, bytes both ways]``. Servers with no reply after their
    first push are left out.

    A reply is timed when it is read, and replies are read only while the training
    thread waits: pushes sent during backward make the first span hold compute too (so
    the bytes over it are a lower bound of the server's speed), the second leaves out
    what the server did during backward (an upper bound, roughly). Pure.
    """
    return [
        [s, last - first, last - max(first, waited), n]
        for s, (first, last, n) in traffic.items()
        if last > first
    ]


class StepReporter:
    """One optimizer's step timer and its conversation with the coordinator.

    Args:
        ctx: the worker's context.
        sender: the reporter that sends this worker's REPORTs (its first optimizer's),
            if not this one: this one then only times its steps, and its step's first
            push sends the sender's report when due.
        timer, cpu_timer, now: the wall clock of a step, the process's CPU clock, and
            the clock that spaces reports (``time.perf_counter``, ``time.process_time``
            and ``time.monotonic``; tests inject their own).

    Not thread-safe: the training thread uses it. :meth:`before_push` may block on a
    control round trip (a map refresh), :meth:`end_step` on LB-BSP's reply; both raise
    what :func:`~trimtab.roles.worker.client.wait` raises.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        sender: StepReporter | None = None,
        timer: Callable[[], float] = time.perf_counter,
        cpu_timer: Callable[[], float] = time.process_time,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ctx = ctx
        self._sender = sender
        self._reports = sender is None
        self._timer, self._cpu_timer, self._now = timer, cpu_timer, now
        self._started = timer()
        self._cpu_started = cpu_timer()
        self._pending: _Report | None = None
        self._next_report = 0.0
        self._sizes: concurrent.futures.Future[Reply] | None = None  # LB-BSP's reply
        self._directive: concurrent.futures.Future[Reply] | None = None  # SaPS's
        #: Whether this step's gradients are to be dropped (the coordinator said this
        #: worker lags behind; SaPS), from the step's first push on.
        self.skipping = False
        #: The clock of the leading worker, when :attr:`skipping`.
        self.lead = 0

    def compute_so_far(self, forward_waits: float) -> tuple[float, float]:
        """This step's compute seconds so far (since the last :meth:`end_step`, less
        ``forward_waits``: forward's waits for values) and its CPU share."""
        compute = self._timer() - self._started - forward_waits
        cpu = (self._cpu_timer() - self._cpu_started) / max(compute, 1e-9)
        return compute, cpu

    def before_push(self, first: bool, clock: int) -> None:
        """At each push of step ``clock`` (``first``: the step's first): route by a map
        the coordinator published since (MAP_NEWS: a migration's, cut at this step or
        later, so that no push of it is answered *moved*), read the coordinator's
        directive, and send the previous step's report when it is due."""
        if first:
            news = self._ctx.client.map_news.take()
            if news is not None:
                self._ctx.adopt_map(news)
        if self._sender is not None:
            if first:
                self._sender.send_due()
            return
        if first and not self.skipping:
            self._check_directive(clock)
        self.send_due()

    def send_due(self) -> None:
        """Send the last step's report if it is due. Never blocks."""
        if self._pending is not None and self._now() >= self._next_report:
            # Where the coordinator needs no report per step (report_s), steps in
            # between are not reported.
            self._sizes = self._report(*self._pending)
            self._pending = None
            self._next_report = self._now() + self._ctx.job.report_s

    def _check_directive(self, clock: int) -> None:
        d = self._directive
        if d is not None and d.done() and d.exception() is None:
            header = headers.read_report_reply(d.result().header)
            self._ctx.refresh_map(header["epoch"])
            if header.get("refresh"):
                self.skipping = True
                self.lead = header.get("lead", clock)
            self._directive = None

    def _report(
        self,
        clock: int,
        batch: int,
        compute: float,
        comm: float,
        cpu: float,
        spans: list[list[float]],
    ) -> concurrent.futures.Future[Reply] | None:
        """Send step ``clock``'s measurements; return the future to wait on under LB-BSP."""
        header = headers.report(
            clock=clock,
            batch=batch,
            compute_s=compute,
            comm_s=comm,
            cpu_share=min(cpu, 1.0),
            floor=self._ctx.routing_floor(),
            spans=spans,
        )
        fut = self._ctx.client.control(header)
        if not self._ctx.job.sizes_batches:
            self._directive = fut  # read at the next step's first push, never waited for
            return None
        return fut

    def send_now(self) -> None:
        """Send the last step's report now, due or not: before a barrier or a broadcast,
        so that there the coordinator holds every worker's clock and acts on the step
        boundary (a migration planned at it starts before, not after, the barrier).
        Never blocks (LB-BSP's answer is read at the next :meth:`end_step`)."""
        if self._sender is not None:
            self._sender.send_now()
        elif self._pending is not None:
            self._sizes = self._report(*self._pending)
            self._pending = None
            self._next_report = self._now() + self._ctx.job.report_s

    def flush(self) -> None:
        """Send the last step's report now, due or not (the optimizer is closing: the
        coordinator then holds this worker's exact clock, and under LB-BSP the other
        workers' wait for this step's sizes ends). Never blocks; never raises."""
        if self._reports and self._pending is not None:
            with contextlib.suppress(Exception):  # the job may be over: nothing to tell
                self._report(*self._pending)
            self._pending = None

    def spans_of_step(self, traffic: Mapping[int, list[float]], waited: float) -> list[list[float]]:
        """:func:`spans_of_step` (a method, so a test can watch it)."""
        return spans_of_step(traffic, waited)

    def end_step(
        self,
        clock: int,
        batch: int,
        compute: float,
        comm: float,
        cpu: float,
        traffic: Mapping[int, list[float]],
        waited: float,
    ) -> list[int] | None:
        """Step ``clock`` is over: keep its measurements for the next push to report,
        and start timing the next step. Under LB-BSP, wait for the answer to the
        previous step's report and return every worker's batch size for the next step
        (the policy is one step behind, as the paper's semi-dynamic scheme); in an
        elastic job, send this step's report and wait for its answer (the step
        boundary: the sizes follow the workers taking part); else None. Blocks under
        LB-BSP and in an elastic job."""
        if self._reports:
            spans = self.spans_of_step(traffic, waited)
            self._pending = (clock, batch, compute, comm, cpu, spans)
            if self._ctx.job.elastic:
                # The job's step boundary: every worker's report of this step is answered
                # at once, with the next step's sizes over the workers taking part then.
                self._sizes = self._report(*self._pending)
                self._pending = None
        reply, self._sizes = self._sizes, None
        sizes = None
        if reply is not None:
            header = headers.read_report_reply(wait(reply, self._ctx.timeout_s).header)
            self._ctx.refresh_map(header["epoch"])
            sizes = header["sizes"]
        self._started = self._timer()
        self._cpu_started = self._cpu_timer()
        return sizes
