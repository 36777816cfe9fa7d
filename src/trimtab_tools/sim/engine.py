"""The discrete-event loop of a simulated job: steps, the coordinator's step boundaries,
migrations, servers joining and retiring, in simulated time on a heap of events.

Events, each at its simulated time:

* ``step k``: every worker's step ``k`` through the data path at once
  (:func:`~trimtab_tools.sim.datapath.step_times`): the workers' start times, their
  batch sizes and slowdowns, the map in force and the servers' speeds at ``k``;
* ``reports k``: the last worker's report of step ``k`` reaches the coordinator (with
  step ``k + 1``'s first push, :mod:`.reporting`), which feeds the policies what the
  runtime's coordinator feeds them (samples, PSLD's step times and spans, load counters)
  and, at the step boundary, asks them what the runtime asks (``coordinator.rebalance``
  and ``steps``): PSLD's new map, scaling's server wanted or given back, LB-BSP's sizes;
* ``migrated``: the last handover of a migration reached its new owner;
* ``joined``: a server asked for by the scaling policy serves.

A worker starts its next step as soon as its replies are in. Under an adaptive batching
it waits, at step ``k + 1``'s end, for the sizes decided from step ``k``'s reports, which
hold from step ``k + 2`` (LB-BSP's semi-dynamic scheme, ``StepReporter.end_step``). A
map decided during step ``k + 1`` holds from step ``k + 2``, as in the runtime. Not thread-safe.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
from collections.abc import Callable
from typing import Any

import numpy as np

from trimtab.policies.batching import WorkerSample
from trimtab.policies.psld import chunk_costs, rebalance
from trimtab_tools.sim.cluster import Nodes
from trimtab_tools.sim.cuts import cut_now, handover_rates, seen_when_cut
from trimtab_tools.sim.datapath import StepInput, StepTimes, ready_shares, step_times
from trimtab_tools.sim.decisions import Policies
from trimtab_tools.sim.job import SimJob
from trimtab_tools.sim.members import Members
from trimtab_tools.sim.noise import Draws, WindowRecord
from trimtab_tools.sim.reporting import ReportTiming, map_reaches
from trimtab_tools.sim.trace import Decision, Trace

__all__ = ["Decision", "Simulation", "Trace"]

#: Samples kept per worker for the batch-sizing policy (as the coordinator's
#: ``steps.HISTORY_STEPS``).
HISTORY_STEPS = 50
#: The trace keeps every map of a job of at most this many chunks.
MAPS_CHUNKS = 1024


class Simulation:
    """One job, simulated. :meth:`run` blocks until its last step (CPU only).

    Args:
        job: what to simulate.
        policies: the policy objects to drive (default: those ``job``'s settings name,
            built as the coordinator builds them).

    Raises :class:`~trimtab.errors.ConfigError` from the constructor for a straggler
    naming a node the job does not have.
    """

    def __init__(self, job: SimJob, policies: Policies | None = None) -> None:
        self.job = job
        s = job.settings
        self.policies = p = policies or Policies(s)
        # As the coordinator's "elastic" term: a lost worker is dropped and new ones
        # join at step boundaries, every worker waiting for each boundary's answer.
        self.elastic = s.elastic_workers and p.consistency.synchronous
        self.members = Members(
            s.workers,
            job.faults,
            elastic=self.elastic,
            min_workers=s.elastic.min_workers or s.workers,
            max_workers=s.max_workers,
        )
        self.nodes = Nodes(job.cluster, job.stragglers, self.members.slots, s.max_servers)
        tensors, chunks = job.tensors(), job.chunks()
        self.chunk_bytes = [c.nbytes for c in chunks]
        self.sizes = np.array(self.chunk_bytes, dtype=float)
        self.tensor_of = np.array([c.tensor for c in chunks], dtype=np.int64)
        in_order = job.cluster.pushes_in_order  # then every gradient at the compute's end
        self.shares = ready_shares(self.sizes, 1.0 if in_order else job.cluster.forward_share)
        owners = p.call("placement.place", p.placement.place, tensors, chunks, s.servers)
        self.owners = np.array(owners, dtype=np.int64)
        self.available = np.full(len(chunks), -np.inf)
        self.active = [True] * s.servers
        self.target_servers = s.servers
        self.adaptive = p.batching.adaptive
        ranks = range(s.workers)
        self.history: collections.defaultdict[int, collections.deque[WorkerSample]] = (
            collections.defaultdict(lambda: collections.deque(maxlen=HISTORY_STEPS))
        )
        first = p.call(
            "batching.batch_sizes", p.batching.batch_sizes, {r: [] for r in ranks}, job.global_batch
        )
        self.batches = np.array([first[r] for r in ranks], dtype=float)
        self.busy = np.zeros(s.max_servers)
        self.moved = np.zeros(s.max_servers)
        # PSLD's figures' measurement noise (recorded on a real run; none by default).
        self.draws = Draws(job.cluster.measurement_noise, job.cluster.seed + 2, s.max_servers)
        self._joins: list[int] = []  # the steps after whose reports a server joins
        self.trace = Trace()
        self._windows = WindowRecord(self.trace.windows)  # PSLD's windows, for validate-sim
        if len(chunks) <= MAPS_CHUNKS:
            self.trace.maps[0] = list(owners)
        #: What the consistency policy did (asynchronous jobs; none here).
        self.counters: collections.Counter[str] = collections.Counter()
        #: Workers the straggler detector named (asynchronous jobs; none here).
        self.flagged_workers: set[int] = set()
        self._queue: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = 0
        self.reporting = ReportTiming(self._at, job.cluster.latency_s, job.steps, self.elastic)
        self._started = -1  # the last step computed
        self._last_step: StepTimes | None = None
        # The step under way as PSLD sees it (input, figures, window noise); figures cut.
        self._under_way: tuple[int, StepInput, StepTimes, np.ndarray] | None = None
        self._seen: dict[int, StepTimes] = {}
        self._handed = np.zeros(0, dtype=np.int64)  # chunks handed over at such a cut
        self._handed_at = -np.inf
        self._ends: dict[int, dict[int, float]] = {}  # a step's ends by rank, until the next
        self._sizes: dict[int, tuple[float, np.ndarray]] = {}  # step -> (decided, sizes)
        self._last_factors = np.ones(s.workers)
        self._pending: tuple[int, np.ndarray] | None = None  # (from step, owners)
        self._migrating = False
        self._unsettled = False
        self._last_decision = 0
        self._epoch = 0

    # -- the loop ----------------------------------------------------------------

    def run(self) -> Trace:
        """Simulate every step; return the trace. Blocks (CPU). Raises what a policy
        raises (:class:`~trimtab.errors.ConfigError` for a batch it cannot split)."""
        # A server reports its counters from when it joins, before the first step: the
        # first step's reports then make a window each, as the runtime's do.
        for srv in range(len(self.active)):
            self.policies.call("speeds.observe", self.policies.speeds.observe, srv, 0.0, 0.0)
        self._at(0.0, lambda now: self._step(0, np.zeros(self.job.settings.workers)))
        while self._queue:
            now, _, action = heapq.heappop(self._queue)
            action(now)
        return self.trace

    def _at(self, when: float, action: Callable[[float], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, action))

    # -- the workers and servers -------------------------------------------------

    @property
    def ranks(self) -> list[int]:
        """The live workers' ranks, in the order of the step's arrays."""
        return self.members.ranks

    def _step(self, k: int, starts: np.ndarray) -> None:
        c = self.job.cluster
        self._started = k
        before = list(self.ranks)
        lost = self.members.lost_at(k)
        if lost:  # dropped at once: the step completes over the others' samples
            keep = np.array([r not in lost for r in before])
            starts, self.batches = starts[keep], self.batches[keep]
            self._decide("worker_lost", k, float(starts.min()), {"workers": lost})
        self.members.reached(k, float(starts.min()), c.join_s)
        ranks = list(self.ranks)
        if self._pending is not None and k >= self._pending[0]:
            self._switch(self._pending[1], float(starts.min()))
        factors = self.nodes.worker_factors(k)[ranks]
        proc, cap, delay = self.nodes.server_rates(k)
        x = StepInput(
            starts=starts,
            compute=self.batches * c.sample_s * factors,
            sizes=self.sizes,
            owners=self.owners,
            shares=self.shares,
            available=self.available,
            proc=proc,
            cap=cap,
            delay=delay,
            update_bps=c.update_bps,
            worker_nic_bps=c.worker_nic_bps,
            server_nic_bps=c.server_nic_bps,
            latency_s=c.latency_s,
            workers_per_host=c.workers_per_host,
            servers_per_host=c.servers_per_host,
            message_s=c.message_s,
            link=self.nodes.server_links(k),
            in_order=c.pushes_in_order,
            meter_push_s=c.meter_push_s,
            tensors=self.tensor_of,
        )
        t = step_times(x)
        seen_x = x if not c.clean_figures else self._clean_input(k, x)  # what PSLD sees
        seen = t if seen_x is x else step_times(seen_x)
        # A handover delays only the first step under the new map: by the next, every
        # moved chunk was merged at its new owner.
        self.available = np.full(len(self.sizes), -np.inf)
        ends = t.ends + c.step_overhead_s
        self._last_step, self._last_factors = t, factors
        _, windows = self.draws.at(k)  # a window's speed scatters: its busy time does
        self.busy[: seen.busy_s.size] += seen.busy_s / windows[: seen.busy_s.size]
        self._under_way = (k, seen_x, seen, windows)
        self.moved[: t.nbytes.size] += t.nbytes
        tr = self.trace
        tr.starts.append(float(starts.min()))
        tr.ends.append(float(ends.max()))
        tr.worker0_ends.append(float(ends[0]))
        tr.batch_min.append(int(self.batches.min()))
        tr.batch_max.append(int(self.batches.max()))
        tr.epochs.append(self._epoch)
        if self.batches.size <= 16:
            tr.batches.append(self.batches.astype(int).tolist())
        report = functools.partial(self._reports, k, ranks, self.batches, x, t, seen)
        self.reporting.step(k, x, float(ends.max()), report)
        self._ends[k] = dict(zip(ranks, ends.tolist(), strict=True))
        self._maybe_start(k + 1)

    def _maybe_start(self, k: int) -> None:
        """Start step ``k`` once step ``k - 1`` is done and, under an adaptive batching
        from step 2 on, the sizes decided from step ``k - 2``'s reports have reached the
        workers: a worker reports a step with its next step's first push and waits for
        the answer at that next step's end (``StepReporter.end_step``: the policy is one
        step behind, as LB-BSP's semi-dynamic scheme)."""
        if k >= self.job.steps or k - 1 not in self._ends:
            return
        lag = 1 if self.elastic else 2  # elastic: every worker waits at each boundary
        if (self.adaptive or self.elastic) and k >= lag:
            if k not in self._sizes:
                return
            decided, sizes = self._sizes.pop(k)
            self.batches = sizes
            ready = decided + self.job.cluster.latency_s
        else:
            ready = -np.inf
        ended = self._ends.pop(k - 1)
        # A worker that joined at the boundary starts with the others' answer.
        starts = np.array([max(ended.get(r, ready), ready) for r in self.ranks])
        self._at(float(starts.min()), lambda now: self._step(k, starts))

    def _switch(self, owners: np.ndarray, now: float) -> None:
        """The map of a migration takes effect: each moving chunk reaches its new owner
        once its old owner applied the last step's update, with its optimizer state."""
        c = self.job.cluster
        every = np.flatnonzero(owners != self.owners)
        moving = np.setdiff1d(every, self._handed)  # not handed over at their cut
        last = self._last_step
        cut = last.updated if last is not None else np.zeros(len(self.sizes))
        rate = self._handover_rate(moving, owners)
        self.available = np.full(len(self.sizes), -np.inf)
        self.available[moving] = (
            cut[moving] + c.latency_s + self.sizes[moving] * c.state_factor / rate
        )
        moved = int(self.sizes[every].sum() * c.state_factor)
        self.trace.bytes_moved += moved
        self.owners = owners
        self._pending = None
        self._epoch += 1
        if owners.size <= MAPS_CHUNKS:
            self.trace.maps[self._epoch] = owners.tolist()
        done = max(float(self.available[moving].max(initial=now)), self._handed_at)
        self._handed, self._handed_at = np.zeros(0, dtype=np.int64), -np.inf
        self._at(max(done + c.latency_s, now), self._migrated)

    def _handover_rate(self, moving: np.ndarray, owners: np.ndarray) -> np.ndarray:
        _, cap, _ = self.nodes.server_rates(self._started)
        link = self.nodes.server_links(self._started)
        nic = self.job.cluster.server_nic_bps
        return handover_rates(nic, cap, link, self.owners[moving], owners[moving])

    def _cut_under_way(self, owners: np.ndarray, now: float) -> None:
        """Chunks leaving for ``owners`` whose server had no push of the step under way
        when the new map reached it (:mod:`.reporting`) are cut at its round: that step is
        simulated again as PSLD sees it, their pushes answered moved; they are handed
        over at once. (The step's timing stays the old map's.)"""
        under_way = self._under_way
        if under_way is None or under_way[0] != self._started:
            return
        step, x, seen, windows = under_way
        c = self.job.cluster
        moving = np.flatnonzero(owners != self.owners)
        reached = map_reaches(now, c.decision_s, c.latency_s)
        handed = cut_now(moving, self.owners, seen.first_queued, reached)
        if handed.size == 0:
            return
        self.trace.learned[step] = self._epoch + 1  # answered moved, the workers fetch it
        again = seen_when_cut(x, handed)
        n = again.busy_s.size
        self.busy[:n] += (again.busy_s - seen.busy_s) / windows[:n]
        self.moved[:n] += again.nbytes - seen.nbytes
        self._seen[step] = again
        self._under_way = (step, x, again, windows)
        rate = self._handover_rate(handed, owners)
        handover = now + c.latency_s + self.sizes[handed] * c.state_factor / rate
        self._handed, self._handed_at = handed, float(handover.max())

    def _migrated(self, now: float) -> None:
        self._migrating = False
        self.trace.migrations += 1
        if self._unsettled:
            self._membership_changed(now, self._started + 1)

    # -- the coordinator -----------------------------------------------------------

    def _clean_input(self, k: int, x: StepInput) -> StepInput:
        """Step ``k``'s input without the machine's jitter (``clean_figures``): PSLD's
        figures come from it."""
        proc, cap, delay = self.nodes.server_rates(k, jitter=False)
        factors = self.nodes.worker_factors(k, jitter=False)[self.ranks]
        compute = self.batches * self.job.cluster.sample_s * factors
        link = self.nodes.server_links(k, jitter=False)
        return dataclasses.replace(x, compute=compute, proc=proc, cap=cap, delay=delay, link=link)

    def _reports(
        self,
        k: int,
        ranks: list[int],
        batch: np.ndarray,
        x: StepInput,
        t: StepTimes,
        seen: StepTimes,
        now: float,
    ) -> None:
        p = self.policies
        seen = self._seen.pop(k, seen)  # a cut at the round under way changed the figures
        self._under_way = None if k == self._started else self._under_way  # reported
        compute = x.compute
        comm = np.maximum(t.ends - t.compute_ends, 0.0)
        share = 1.0 / self._last_factors
        for i in np.argsort(t.ends, kind="stable").tolist():  # in the order they arrive
            sample = WorkerSample(
                ranks[i],
                int(batch[i]),
                max(float(compute[i]), 1e-9),
                float(comm[i]),
                min(float(share[i]), 1.0),
            )
            self.history[ranks[i]].append(sample)
            if p.psld is not None:
                p.call(
                    "psld.observe_step", p.psld.observe_step, k, sample.compute_s + sample.comm_s
                )
        servers = len(self.active)
        keep = servers <= 16  # the trace keeps PSLD's figures (validate-sim's noise)
        for srv in range(servers):  # each server's load report (its counters)
            if keep:
                self._windows.take(srv, float(self.busy[srv]), float(self.moved[srv]))
            p.call(
                "speeds.observe",
                p.speeds.observe,
                srv,
                float(self.busy[srv]),
                float(self.moved[srv]),
            )
        if p.psld is not None or keep:
            bounds, _ = self.draws.at(k)  # the workers' spans scatter more than the model's
            for srv in np.flatnonzero(seen.seen_bytes[:servers] > 0).tolist():
                nbytes = float(seen.seen_bytes[srv])
                span = float(seen.span_s[srv]) / bounds[srv, 0]
                tail = float(seen.tail_s[srv]) / bounds[srv, 1]
                if keep and span > 0 and tail > 0:
                    self.trace.bounds.setdefault(srv, []).append((nbytes / span, nbytes / tail))
                    self.trace.bound_clocks.setdefault(srv, []).append(k)
                if p.psld is not None:
                    p.call("speeds.observe_step", p.speeds.observe_step, srv, nbytes, span, tail)
        self._boundary(k + 1, now)
        if any(j <= k for j in self._joins):  # a server calibrated to join in steps
            self._joins = [j for j in self._joins if j > k]
            self._joined(now)
        if self.elastic:  # Elastic._boundary: joiners in, every live rank's share
            joined = self.members.joining(now)
            if joined:
                self._decide("worker_joined", k + 1, now, {"workers": joined})
        then = k + (1 if self.elastic else 2)
        if not (self.adaptive or self.elastic) or then >= self.job.steps:
            return
        histories = {r: list(self.history[r]) for r in self.ranks}
        sizes = p.call(
            "batching.batch_sizes", p.batching.batch_sizes, histories, self.job.global_batch
        )
        vector = [sizes[r] for r in self.ranks]
        self._sizes[then] = (now, np.array(vector, dtype=float))
        self.trace.sizes_last = vector
        self._maybe_start(then)

    def _boundary(self, clock: int, now: float) -> None:
        """As ``Rebalancer.step_boundary``: PSLD's map, scaling's server wanted or given
        back, at most one migration at a time."""
        p = self.policies
        rotate = self.job.settings.elastic.rebalance_every
        if self._migrating or self._pending or clock <= self._last_decision:
            return
        n = len(self.active)
        owners = tuple(self.owners.tolist())
        if rotate and clock - self._last_decision >= rotate:  # a forced migration
            live = [s for s, a in enumerate(self.active) if a]
            rotated = [live[(live.index(o) + 1) % len(live)] for o in owners]
            if tuple(rotated) != owners:
                self._last_decision = clock
                self._migrate(np.array(rotated, dtype=np.int64), clock, now)
            return
        if p.psld is None:
            return
        speeds = p.call("speeds.speeds", p.speeds.speeds, n)
        probe = frozenset(p.call("speeds.unknown", p.speeds.unknown, n))
        errors = p.call("speeds.errors", p.speeds.errors, n)
        new = p.call(
            "psld.decide",
            p.psld.decide,
            clock,
            self._chunk_costs(),
            owners,
            speeds,
            active=self.active,
            probe=probe,
            errors=errors,
        )
        serving = sum(self.active)
        if (
            serving < self.job.settings.max_servers
            and self.target_servers < serving + 1
            and p.call("scaling.wants_server", p.scaling.wants_server, speeds, self.active)
        ):
            self.target_servers = serving + 1
            self._decide("server_wanted", clock, now, {"server": n})
            if self.job.cluster.join_steps is None:
                self._at(now + self.job.cluster.join_s, self._joined)
            else:  # clock - 1: the step whose reports asked for it
                self._joins.append(clock - 1 + self.job.cluster.join_steps)
        lasting = p.call("speeds.lasting", p.speeds.lasting, n)
        idle = p.call(
            "scaling.idle_server",
            p.scaling.idle_server,
            clock,
            owners,
            self.active,
            lasting,
            settled=not p.psld.trial_running,
        )
        if new is None and idle is not None:
            self.active[idle] = False  # it owns nothing: drained, then retired at once
            self.target_servers = sum(self.active)
            self._decide("server_retired", clock, now, {"server": idle})
            return
        if new is not None and new != owners:
            self._last_decision = clock
            self._migrate(np.array(new, dtype=np.int64), clock, now)

    def _chunk_costs(self) -> list[int]:
        return chunk_costs(self.chunk_bytes, len(self.ranks))

    def _joined(self, now: float) -> None:
        self.active.append(True)
        self._decide("server_joined", self._started + 1, now, {"server": len(self.active) - 1})
        self._membership_changed(now, self._started + 1)

    def _membership_changed(self, now: float, clock: int) -> None:
        """As ``Rebalancer.membership_changed``: move chunks onto a server that joined."""
        if self._migrating or self._pending:
            self._unsettled = True
            return
        self._unsettled = False
        p = self.policies
        n = len(self.active)
        speeds = p.call("speeds.speeds", p.speeds.speeds, n) or [1.0] * n
        owners = tuple(self.owners.tolist())
        plan = p.call(
            "psld.rebalance", rebalance, self._chunk_costs(), owners, speeds, active=self.active
        )
        if plan.owners != owners:
            self._migrate(np.array(plan.owners, dtype=np.int64), clock, now)

    def _migrate(self, owners: np.ndarray, clock: int, now: float) -> None:
        moving = np.flatnonzero(owners != self.owners)
        self._migrating = True
        self._cut_under_way(owners, now)
        self._pending = (self._started + 1, owners)
        self._decide(
            "migration",
            clock,
            now,
            {
                "chunks": int(moving.size),
                "bytes": int(self.sizes[moving].sum()),
                "from": sorted(set(self.owners[moving].tolist())),
                "to": sorted(set(owners[moving].tolist())),
                "holds_from": self._started + 1,
            },
        )

    def _decide(self, kind: str, clock: int, now: float, detail: dict[str, Any]) -> None:
        self.trace.decisions.append(Decision(kind, clock, round(now, 6), detail))
