"""Asynchronous jobs (``asp``, ``ssp``, ``saps``): every worker at its own pace, each of
its steps an event, the consistency policy asked what the servers and the coordinator
ask it.

A worker's step: it computes (``batch * sample_s * slowdown``), pushes its whole
gradient through its NIC, each server takes its part in a first-in-first-out queue in
the order the pushes come (merge and update at once: asynchronous modes apply a push
on arrival) and sends the values back through its NIC. On the way:

* each push is checked (``check``) and weighed (``discount``: SaPS's ``free / tau``, or
  dropped past ``tau_max``) from its staleness: the updates applied since the values it
  was computed from (all chunks alike, one update a push);
* its reply is held while the policy says so (``may_release``: SSP's bound, by waiting
  for the slowest worker);
* its report reaches the coordinator, which, under a policy that ``skips_stragglers``,
  asks the straggler detector (``DETECTORS``' lag) at each report, as ``Steps.reply``
  does; a worker named there hears so with its next step's first push and skips the
  step after it (drops its gradient, refreshes its values, jumps to one behind the
  leader's clock), as ``DistributedOptimizer._skip_ahead`` does.

A "step" of the figures is a global batch's worth of applied samples (dropped pushes do
not count), so that throughput compares with a synchronous job's. Simplified beside the
synchronous model: a worker's push reaches every server when its whole gradient has
left its NIC, and a server's queue takes the whole part at once. Not thread-safe.
"""

from __future__ import annotations

import collections
import functools
import heapq
from collections.abc import Callable

import numpy as np

from trimtab.policies.batching import WorkerSample
from trimtab.policies.consistency import PushInfo
from trimtab_tools.sim.cluster import Nodes
from trimtab_tools.sim.decisions import Policies
from trimtab_tools.sim.job import SimJob
from trimtab_tools.sim.trace import Trace

__all__ = ["AsyncSimulation"]


class AsyncSimulation:
    """One asynchronous job, simulated. :meth:`run` blocks until ``job.steps`` global
    batches are applied (CPU only). Raises :class:`~trimtab.errors.ConfigError` from
    the constructor for a straggler naming a node the job does not have.

    Attributes (after :meth:`run`): ``trace``; ``counters`` (pushes ``dropped``,
    ``discounted``, ``refused`` by the policy, replies ``held``, steps ``skipped``);
    ``flagged_workers`` (those the detector named).
    """

    def __init__(self, job: SimJob, policies: Policies | None = None) -> None:
        self.job = job
        s = job.settings
        self.policies = p = policies or Policies(s)
        self.nodes = Nodes(job.cluster, job.stragglers, s.workers, s.max_servers)
        tensors, chunks = job.tensors(), job.chunks()
        self.sizes = np.array([c.nbytes for c in chunks], dtype=float)
        owners = p.call("placement.place", p.placement.place, tensors, chunks, s.servers)
        self.owners = np.array(owners, dtype=np.int64)
        self.active = [True] * s.servers
        self.batches = np.full(s.workers, float(job.batch))
        self.ranks = list(range(s.workers))
        self.trace = Trace()
        self.counters = collections.Counter[str]()
        self.flagged_workers: set[int] = set()
        self._server_bytes = np.bincount(self.owners, self.sizes, s.servers)
        self._server_chunks = np.bincount(self.owners, None, s.servers)
        self._free_in = np.zeros(s.servers)
        self._free_out = np.zeros(s.servers)
        self._version = 0  # updates applied (all chunks alike: one a push)
        self._read = [0] * s.workers  # the version each worker's values are
        self._clock = [0] * s.workers
        self._pushed: dict[int, int] = dict.fromkeys(range(s.workers), 0)
        self._last_push: dict[int, int | None] = dict.fromkeys(range(s.workers))
        self._skip_next: dict[int, int] = {}  # worker -> the leader's clock it jumps to
        # Replies the policy holds: (worker, when ready, its step's figures, counted).
        self._held: list[tuple[int, float, tuple[int, float, float, float], bool]] = []
        self._applied = 0.0
        self._queue: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = 0
        self._clocks: dict[int, int] = {}  # the coordinator's (Steps.clocks)
        self._history: dict[int, collections.deque[WorkerSample]] = {
            r: collections.deque(maxlen=50) for r in range(s.workers)
        }
        self._done = False

    def run(self) -> Trace:
        """Simulate until ``job.steps`` global batches are applied; return the trace.
        Blocks (CPU)."""
        for w in range(self.job.settings.workers):
            self._at(0.0, functools.partial(self._start, w))
        while self._queue and not self._done:
            now, _, action = heapq.heappop(self._queue)
            action(now)
        return self.trace

    def _at(self, when: float, action: Callable[[float], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, action))

    # -- a worker's step -------------------------------------------------------------

    def _start(self, w: int, now: float) -> None:
        c = self.job.cluster
        clock = self._clock[w]
        factor = float(self.nodes.worker_factors(clock)[w])
        compute = float(self.batches[w]) * c.sample_s * factor
        end = now + compute
        model = float(self.sizes.sum())
        lead = self._skip_next.pop(w, None)
        if lead is not None:  # SaPS's directive: drop this step's stale gradient
            self.counters["skipped"] += 1
            back = end + 2 * c.latency_s + model / min(c.worker_nic_bps, c.server_nic_bps)
            self._clock[w] = max(clock, lead - 1) + 1
            self._read[w] = self._version
            self._at(back, lambda t: self._finished(w, clock, now, compute, t, factor))
            return
        arrive = end + model / c.worker_nic_bps + c.latency_s
        self._at(arrive, lambda t: self._pushed_at(w, clock, now, compute, t, factor))

    def _pushed_at(
        self, w: int, clock: int, started: float, compute: float, now: float, factor: float
    ) -> None:
        """Worker ``w``'s push of step ``clock`` reaches the servers at ``now``."""
        p, c = self.policies, self.job.cluster
        push = PushInfo(w, clock, float(self.batches[w]), self._read[w], self._version)
        why = p.call(
            "consistency.check", p.server_consistency.check, push, self._version, self._last_push[w]
        )
        weight = (
            None if why else p.call("consistency.discount", p.server_consistency.discount, push)
        )
        self._last_push[w] = clock
        if why:
            self.counters["refused"] += 1
        elif weight is None:
            self.counters["dropped"] += 1
        else:
            self.counters["discounted"] += weight < 1.0
        proc, cap, delay = self.nodes.server_rates(max(self._pushed.values()))
        proc, cap, delay = (
            proc[: self._server_bytes.size],
            cap[: self._server_bytes.size],
            delay[: self._server_bytes.size],
        )
        nbytes = self._server_bytes
        merge = nbytes * (np.maximum(1 / proc, 1 / cap) + delay + 1 / c.update_bps)
        merge += self._server_chunks * c.message_s
        held = nbytes > 0
        done = np.maximum(now, self._free_in) + merge
        self._free_in = np.where(held, done, self._free_in)
        out = np.maximum(done, self._free_out) + nbytes * np.maximum(1 / c.server_nic_bps, 1 / cap)
        self._free_out = np.where(held, out, self._free_out)
        if weight is not None:
            self._version += 1
            self._apply(float(self.batches[w]), now)
        self._pushed[w] = clock + 1
        back = float(out[held].max(initial=now)) + c.latency_s
        back += float(nbytes.sum()) / c.worker_nic_bps
        self._clock[w] = clock + 1
        self._held.append((w, back, (clock, started, compute, factor), False))
        self._release()

    def _release(self) -> None:
        """Let the held replies go that the policy allows now (``may_release``, asked
        again at each push: SSP's slowest worker may have caught up)."""
        p = self.policies
        active = range(self.job.settings.workers)
        keep = []
        for w, ready, step, counted in self._held:
            if p.call(
                "consistency.may_release",
                p.server_consistency.may_release,
                self._clock[w],
                self._pushed,
                active,
            ):
                self._at(ready, functools.partial(self._replied, w, step))
            else:
                keep.append((w, ready, step, True))
                self.counters["held"] += not counted
        self._held = keep

    def _replied(self, w: int, step: tuple[int, float, float, float], now: float) -> None:
        self._read[w] = self._version
        clock, started, compute, factor = step
        self._finished(w, clock, started, compute, now, factor)

    def _finished(
        self, w: int, clock: int, started: float, compute: float, now: float, factor: float
    ) -> None:
        """Worker ``w`` has its values after step ``clock``: it reports and goes on."""
        if w == 0:
            self.trace.worker0_ends.append(now)
        self._report(w, clock, compute, now - started - compute, factor, now)
        if not self._done:
            self._at(now, lambda t: self._start(w, t))

    # -- the coordinator ---------------------------------------------------------------

    def _report(
        self, w: int, clock: int, compute: float, comm: float, factor: float, now: float
    ) -> None:
        p = self.policies
        sample = WorkerSample(
            w, int(self.batches[w]), max(compute, 1e-9), max(comm, 0.0), min(1.0 / factor, 1.0)
        )
        self._history[w].append(sample)
        self._clocks[w] = clock + 1
        if not p.consistency.skips_stragglers:
            return
        lagging = p.call("detection.stragglers", p.detector.stragglers, self._clocks)
        if w in lagging:
            self.flagged_workers.add(w)
            self._skip_next[w] = max(self._clocks.values())

    def _apply(self, samples: float, now: float) -> None:
        """Count ``samples`` applied; a global batch's worth ends a figure step."""
        self._applied += samples
        while self._applied >= self.job.global_batch * (len(self.trace.ends) + 1):
            if not self.trace.ends:
                self.trace.starts.append(0.0)
            else:
                self.trace.starts.append(self.trace.ends[-1])
            self.trace.ends.append(now)
            self.trace.epochs.append(0)
            self.trace.batch_min.append(int(self.batches.min()))
            self.trace.batch_max.append(int(self.batches.max()))
            if len(self.trace.ends) >= self.job.steps:
                self._done = True
                return
