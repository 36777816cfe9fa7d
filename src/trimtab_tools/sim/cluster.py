"""The modelled hardware: how fast each worker computes and each server and link moves
bytes, step by step, with the ``--straggler`` specs applied.

A worker's compute per step is ``batch * sample_s * factor``; its factor comes from
:class:`trimtab.faults.stragglers.WorkerStraggler` (the very schedule a real worker
follows: static and transient slowdowns, drift seeded by the rank as in a real run;
``cpu=N`` competitors make it ``1 + N`` times slower, as N busy processes sharing its
core would). A server's ``bandwidth`` spec caps its link both ways, ``delay`` adds
seconds per byte, ``cpu=N`` divides its processing speed by ``1 + N``.

Pure: no I/O, no clock; the specs are parsed once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from trimtab.errors import ConfigError
from trimtab.faults.stragglers import StragglerSpec, WorkerStraggler
from trimtab_tools.sim.noise import RecordedNoise

__all__ = ["ClusterModel", "Nodes"]


@dataclasses.dataclass(frozen=True)
class ClusterModel:
    """What the simulated machines can do.

    Attributes:
        sample_s: a worker's compute seconds per sample (forward and backward).
        forward_share: the part of a step's compute before the first gradient (the
            forward pass); backward produces the chunks, last tensor first, over the rest
            (1: every gradient at the end of the compute, as a script that sleeps and
            then hands all its gradients over).
        worker_nic_bps: each worker host's NIC, bytes/s each way (shared by the
            workers of that host).
        server_nic_bps: each server host's NIC, bytes/s each way (shared likewise).
        server_bps: what one server merges, bytes/s (its processing speed).
        update_bps: what one server's optimizer step covers, bytes/s of values.
        latency_s: one-way latency of every link.
        workers_per_host, servers_per_host: nodes sharing one NIC.
        step_overhead_s: a worker's fixed seconds per step outside compute and waits
            (its optimizer's own bookkeeping).
        state_factor: bytes a migrated chunk carries per byte of value (value plus
            optimizer state: 2 for momentum SGD).
        join_s: seconds from a scaling decision to the new server serving.
        jitter: the spread of each node's speed from step to step: every worker's
            compute and every server's rates are multiplied, each step, by a
            log-normal factor of this standard deviation (0: steady machines; a shared
            machine's noise makes PSLD's trials fail and retry).
        seed: the jitter's random seed (runs are repeatable).
        server_links: ``(server, bytes/s)``: links the kernel shapes below the NIC
            (the test bed's ``tc``), each way. Unlike a ``bandwidth`` straggler (a
            throttle in the server's process, whose pacing its handlers count as busy),
            a server does not see its shaped link in its busy seconds.
        message_s: CPU seconds each message (a chunk's push or reply) costs the node
            that sends it and the one that takes it, beside its bytes (on a few shared
            cores the TCP path is bound by CPU per message; ``validate-sim`` fits it
            to a run measured in the same sitting).
        join_steps: where given, a server asked for serves this many of the job's
            steps after the step whose reports asked for it (``validate-sim``
            calibrates the join in steps, from the run record), instead of ``join_s``.
        measurement_noise: deviations of PSLD's speed figures to draw, per step and
            server, on top of what the model's timings give (:mod:`.noise`: the busy
            windows' and the workers' bounds', recorded on a real run); none by default.
        clean_figures: PSLD's figures are those of the step without ``jitter`` (the
            timings keep it), so that their noise is ``measurement_noise``'s alone:
            the jitter fitted to the step times need not scatter the figures as a
            real run's do (on a loaded machine it made them scatter more).
        pushes_in_order: every gradient is handed over at the compute's end and pushed
            in the chunks' order, as ``optimizer.step()`` pushes gradients set outside
            backward (``frontend/optimizer.py``'s ``_send_rest``: validate-sim's
            bandwidth job, whose script sets ``.grad`` itself); else backward pushes
            them last tensor first over its share of the compute (``forward_share``).
        decision_s: seconds from the last report of a step reaching the coordinator to
            its new map leaving it (PSLD's decision, the migration's start, the map's
            publication); a map that enters a server's inbound queue before the
            step's first push there is cut at the round under way (:mod:`.cuts`). ``validate-sim``
            calibrates it from the run record.
        meter_push_s: where given, the busy seconds a server's load meter counts per
            push it handles, with its reply, in place of the model's handler times (its
            busy seconds only, not its timing): ``validate-sim`` calibrates it from the
            calm run's record (``load`` events: 460 to 580 us a push on the test bed,
            where the model's handlers took 130 to 630 us, fitted to the step times).
            PSLD's busy windows then fill as the runtime's do: a window of at least
            ``SpeedEstimator.min_busy_s`` after the first step, so its first plan comes
            on that step's reports, as on the bed.
    """

    sample_s: float = 0.001
    forward_share: float = 1 / 3
    worker_nic_bps: float = 1.25e9
    server_nic_bps: float = 1.25e9
    server_bps: float = 4e9
    update_bps: float = 8e9
    latency_s: float = 50e-6
    workers_per_host: int = 1
    servers_per_host: int = 1
    step_overhead_s: float = 0.0
    state_factor: float = 2.0
    join_s: float = 2.0
    message_s: float = 0.0
    jitter: float = 0.0
    seed: int = 0
    server_links: tuple[tuple[int, float], ...] = ()
    join_steps: int | None = None
    measurement_noise: RecordedNoise = dataclasses.field(default_factory=RecordedNoise)
    clean_figures: bool = False
    pushes_in_order: bool = False
    decision_s: float = 0.0
    meter_push_s: float | None = None

    def __post_init__(self) -> None:
        rates = (self.worker_nic_bps, self.server_nic_bps, self.server_bps, self.update_bps)
        if min(rates) <= 0 or self.sample_s <= 0:
            raise ConfigError(f"rates and --sample-ms must be > 0: {self}")
        if not 0 <= self.forward_share <= 1:
            raise ConfigError(f"--forward-share must be in [0, 1], got {self.forward_share}")
        if min(self.latency_s, self.step_overhead_s, self.join_s, self.message_s) < 0:
            raise ConfigError("latency, step overhead, join time and message cost must be >= 0")
        if not 0 <= self.decision_s < 60:
            raise ConfigError(f"decision_s must be in [0, 60) seconds, got {self.decision_s}")
        if self.meter_push_s is not None and not 0 <= self.meter_push_s < 1:
            raise ConfigError(f"meter_push_s must be in [0, 1) seconds, got {self.meter_push_s}")
        if not 0 <= self.jitter <= 2:
            raise ConfigError(f"--jitter must be in [0, 2], got {self.jitter}")
        if self.workers_per_host < 1 or self.servers_per_host < 1:
            raise ConfigError("--workers-per-host and --servers-per-host must be >= 1")
        if self.join_steps is not None and self.join_steps < 0:
            raise ConfigError(f"join_steps must be >= 0, got {self.join_steps}")
        if self.state_factor < 1:
            raise ConfigError(f"state_factor must be >= 1, got {self.state_factor}")


class Nodes:
    """Each node's speed at each step, from the cluster model and the straggler specs.

    Not thread-safe (a drifting worker's schedule advances as it is asked). Never
    blocks. Raises :class:`ConfigError` from the constructor for a spec naming a node
    the job does not have.
    """

    def __init__(
        self,
        cluster: ClusterModel,
        specs: Sequence[StragglerSpec],
        workers: int,
        max_servers: int,
    ) -> None:
        self.cluster = cluster
        for s in specs:
            limit = workers if s.role == "worker" else max_servers
            if s.index >= limit:
                raise ConfigError(
                    f"straggler {s}: the job has {limit} {s.role}s (indices 0 to {limit - 1})"
                )
        self._workers = {
            r: WorkerStraggler(specs, r)
            for r in sorted({s.index for s in specs if s.role == "worker"})
        }
        self._server_specs = [s for s in specs if s.role == "server"]
        self.num_workers = workers
        self.max_servers = max_servers
        # One stream per kind, drawn a step at a time in step order, so that a worker's
        # noise does not depend on how often the servers were asked.
        self._worker_noise = _Noise(cluster.jitter, cluster.seed, workers)
        self._server_noise = _Noise(cluster.jitter, cluster.seed + 1, max_servers)

    def worker_factors(self, clock: int, *, jitter: bool = True) -> np.ndarray:
        """Each worker's slowdown at step ``clock`` (1.0: none; ``jitter``: with the
        machine's noise)."""
        out = np.ones(self.num_workers)
        for r, straggler in self._workers.items():
            out[r] = straggler.factor(clock)
            # Competitors (cpu=N): WorkerStraggler leaves them to real processes; here
            # N busy processes sharing the worker's core make it 1 + N times slower.
            cpu = sum(s.value for s in straggler.specs if s.kind == "cpu" and s.active(clock))
            out[r] *= 1.0 + cpu
        noisy: np.ndarray = out * self._worker_noise.at(clock) if jitter else out
        return noisy

    def server_rates(
        self, clock: int, *, jitter: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per server at step ``clock``: (processing bytes/s, link cap bytes/s or inf,
        extra seconds per byte; ``jitter``: with the machine's noise)."""
        c = self.cluster
        proc = np.full(self.max_servers, c.server_bps)
        cap = np.full(self.max_servers, np.inf)
        delay = np.zeros(self.max_servers)
        for s in self._server_specs:
            if not s.active(clock):
                continue
            if s.kind == "bandwidth":
                cap[s.index] = min(cap[s.index], s.value)
            elif s.kind == "delay":
                delay[s.index] += s.value
            else:  # cpu
                proc[s.index] /= 1.0 + s.value
        noise = self._server_noise.at(clock) if jitter else 1.0
        return proc / noise, cap / noise, delay

    def server_links(self, clock: int, *, jitter: bool = True) -> np.ndarray:
        """Per server at step ``clock``: its shaped link, bytes/s (inf: none; ``jitter``:
        with the machine's noise)."""
        link = np.full(self.max_servers, np.inf)
        for server, rate in self.cluster.server_links:
            if server < self.max_servers:
                link[server] = rate
        noisy: np.ndarray = link / self._server_noise.at(clock) if jitter else link
        return noisy


class _Noise:
    """Log-normal factors of sd ``sigma``, ``count`` a step, the same for a step however
    often it is asked (steps asked out of order draw the ones between)."""

    def __init__(self, sigma: float, seed: int, count: int) -> None:
        self.sigma, self.count = sigma, count
        self._rng = np.random.default_rng(seed)
        self._steps: list[np.ndarray] = []

    def at(self, clock: int) -> np.ndarray:
        if self.sigma == 0:
            return np.ones(self.count)
        while len(self._steps) <= clock:
            self._steps.append(np.exp(self._rng.normal(0.0, self.sigma, self.count)))
        return self._steps[clock]
