"""The job's Prometheus metrics, kept from the event stream: a listener that turns each
event into counts, gauges and histograms in a registry of its own, which ``/metrics``
exposes. Names follow Prometheus' conventions: the ``trimtab_`` prefix, base units
(seconds, bytes), ``_total`` for counters; labels name a worker, a server or a role,
never a chunk. :data:`METRICS` lists them all (docs/observe.md shows the list).

Needs ``prometheus-client`` (``pip install 'trimtab[observe]'``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from trimtab.roles.coordinator.events import Event

#: Every metric: (name as scraped, type, help). Counters are scraped with ``_total``.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("trimtab_step_duration_seconds", "histogram", "a worker's step: compute plus wait"),
    ("trimtab_steps_total", "counter", "step reports received"),
    ("trimtab_samples_total", "counter", "samples trained (the batch sizes reported)"),
    ("trimtab_worker_step_seconds", "gauge", "a worker's latest step (label worker)"),
    ("trimtab_worker_compute_seconds", "gauge", "its compute part (label worker)"),
    ("trimtab_worker_wait_seconds", "gauge", "its wait for values (label worker)"),
    ("trimtab_worker_batch_size", "gauge", "a worker's latest batch size (label worker)"),
    ("trimtab_worker_clock", "gauge", "a worker's clock: steps done (label worker)"),
    ("trimtab_worker_lag_steps", "gauge", "steps a worker is behind the leader (label worker)"),
    ("trimtab_staleness_steps", "histogram", "steps behind the leader at each report"),
    ("trimtab_server_bytes_total", "counter", "bytes a server moved, in and out (label server)"),
    ("trimtab_server_received_bytes_total", "counter", "bytes a server took in (label server)"),
    ("trimtab_server_sent_bytes_total", "counter", "bytes a server sent out (label server)"),
    ("trimtab_server_busy_seconds_total", "counter", "a server's seconds serving (label server)"),
    ("trimtab_server_requests_total", "counter", "data requests a server served (label server)"),
    ("trimtab_server_speed_bytes_per_second", "gauge", "PSLD's speed figure (label server)"),
    ("trimtab_server_chunks", "gauge", "chunks a server owns (label server)"),
    ("trimtab_server_owned_bytes", "gauge", "bytes of the chunks a server owns (label server)"),
    ("trimtab_placement_epoch", "gauge", "the published placement map's epoch"),
    ("trimtab_migrations_total", "counter", "migrations finished"),
    ("trimtab_migrated_bytes_total", "counter", "bytes of chunks handed between servers"),
    ("trimtab_stragglers_detected_total", "counter", "stragglers detected (label role)"),
    ("trimtab_saps_directives_total", "counter", "SaPS skip-ahead directives sent"),
    ("trimtab_batch_size_decisions_total", "counter", "LB-BSP batch-size decisions sent"),
    ("trimtab_live_servers", "gauge", "servers neither retired nor lost"),
    ("trimtab_live_workers", "gauge", "workers neither done nor lost"),
    ("trimtab_members_lost_total", "counter", "members lost (label role)"),
    ("trimtab_failovers_total", "counter", "failovers to backups completed"),
    ("trimtab_checkpoints_total", "counter", "checkpoints completed"),
    ("trimtab_refused_total", "counter", "requests refused with an error (label code)"),
    ("trimtab_events_total", "counter", "events in the stream (label kind)"),
    ("trimtab_server_growing_rows", "gauge", "growing tables: counts (labels server, count)"),
)

_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LAG_BUCKETS = (0, 1, 2, 3, 4, 8, 16, 32)
_GONE = ("lost", "retired", "done")


class Metrics:
    """Prometheus metrics kept from the event stream: call it with each event (it is a
    listener). Thread-safe (prometheus-client's metrics are); :meth:`exposition` may be
    called from any thread."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        h = {name: help for name, _, help in METRICS}

        def counter(name: str, *labels: str) -> Counter:
            return Counter(name.removesuffix("_total"), h[name], labels, registry=r)

        def gauge(name: str, *labels: str) -> Gauge:
            return Gauge(name, h[name], labels, registry=r)

        self.step = Histogram(
            "trimtab_step_duration_seconds", h["trimtab_step_duration_seconds"],
            buckets=_STEP_BUCKETS, registry=r,
        )  # fmt: skip
        self.staleness = Histogram(
            "trimtab_staleness_steps", h["trimtab_staleness_steps"],
            buckets=_LAG_BUCKETS, registry=r,
        )  # fmt: skip
        self.steps = counter("trimtab_steps_total")
        self.samples = counter("trimtab_samples_total")
        self.w_step = gauge("trimtab_worker_step_seconds", "worker")
        self.w_compute = gauge("trimtab_worker_compute_seconds", "worker")
        self.w_wait = gauge("trimtab_worker_wait_seconds", "worker")
        self.w_batch = gauge("trimtab_worker_batch_size", "worker")
        self.w_clock = gauge("trimtab_worker_clock", "worker")
        self.w_lag = gauge("trimtab_worker_lag_steps", "worker")
        self.s_bytes = counter("trimtab_server_bytes_total", "server")
        self.s_in = counter("trimtab_server_received_bytes_total", "server")
        self.s_out = counter("trimtab_server_sent_bytes_total", "server")
        self.s_busy = counter("trimtab_server_busy_seconds_total", "server")
        self.s_requests = counter("trimtab_server_requests_total", "server")
        self.s_speed = gauge("trimtab_server_speed_bytes_per_second", "server")
        self.s_chunks = gauge("trimtab_server_chunks", "server")
        self.s_owned = gauge("trimtab_server_owned_bytes", "server")
        self.epoch = gauge("trimtab_placement_epoch")
        self.migrations = counter("trimtab_migrations_total")
        self.migrated = counter("trimtab_migrated_bytes_total")
        self.stragglers = counter("trimtab_stragglers_detected_total", "role")
        self.saps = counter("trimtab_saps_directives_total")
        self.sizes = counter("trimtab_batch_size_decisions_total")
        self.live_servers = gauge("trimtab_live_servers")
        self.live_workers = gauge("trimtab_live_workers")
        self.lost = counter("trimtab_members_lost_total", "role")
        self.failovers = counter("trimtab_failovers_total")
        self.checkpoints = counter("trimtab_checkpoints_total")
        self.refused = counter("trimtab_refused_total", "code")
        self.events = counter("trimtab_events_total", "kind")
        self.growing = gauge("trimtab_server_growing_rows", "server", "count")
        # A server's cumulative figures as last reported (LOAD is cumulative; a counter
        # grows by the difference).
        self._loads: dict[int, tuple[float, float, int, float, float]] = {}
        self._members: dict[tuple[str, int], str] = {}
        self._bytes_moved = 0

    def __call__(self, event: Event) -> None:
        kind = event["kind"]
        self.events.labels(kind).inc()
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(event)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format. Never blocks for long."""
        return generate_latest(self.registry)

    def _on_step(self, e: Event) -> None:
        w = str(e["rank"])
        step = float(e["compute_s"]) + float(e["comm_s"])
        self.step.observe(step)
        self.staleness.observe(int(e["lag"]))
        self.steps.inc()
        self.samples.inc(int(e["batch"]))
        self.w_step.labels(w).set(step)
        self.w_compute.labels(w).set(float(e["compute_s"]))
        self.w_wait.labels(w).set(float(e["comm_s"]))
        self.w_batch.labels(w).set(int(e["batch"]))
        self.w_clock.labels(w).set(int(e["clock"]) + 1)
        self.w_lag.labels(w).set(int(e["lag"]))

    def _on_load(self, e: Event) -> None:
        s = int(e["server"])
        now = (
            float(e["busy_s"]), float(e["bytes"]), int(e["requests"]),
            float(e.get("bytes_in", 0)), float(e.get("bytes_out", 0)),
        )  # fmt: skip
        before = self._loads.get(s, (0.0, 0.0, 0, 0.0, 0.0))
        if any(n < b for n, b in zip(now, before, strict=True)):
            before = (0.0, 0.0, 0, 0.0, 0.0)  # a new server process under the same index
        self._loads[s] = now
        label = str(s)
        self.s_busy.labels(label).inc(now[0] - before[0])
        self.s_bytes.labels(label).inc(now[1] - before[1])
        self.s_requests.labels(label).inc(now[2] - before[2])
        self.s_in.labels(label).inc(now[3] - before[3])
        self.s_out.labels(label).inc(now[4] - before[4])
        if e.get("speed") is not None:
            self.s_speed.labels(label).set(float(e["speed"]))
        for count, value in dict(e.get("growing") or {}).items():
            self.growing.labels(label, str(count)).set(int(value))

    def _on_placement(self, e: Event) -> None:
        self.epoch.set(int(e["epoch"]))
        for s, (chunks, nbytes) in enumerate(zip(e["chunks"], e["bytes"], strict=True)):
            self.s_chunks.labels(str(s)).set(chunks)
            self.s_owned.labels(str(s)).set(nbytes)

    def _on_migration(self, e: Event) -> None:
        if e["phase"] != "done":
            return
        self.migrations.inc()
        moved = int(e["bytes_moved"])
        self.migrated.inc(max(0, moved - self._bytes_moved))
        self._bytes_moved = max(self._bytes_moved, moved)

    def _on_straggler(self, e: Event) -> None:
        self.stragglers.labels(str(e["role"])).inc()

    def _on_saps(self, e: Event) -> None:
        self.saps.inc()

    def _on_batch_sizes(self, e: Event) -> None:
        self.sizes.inc()

    def _on_member(self, e: Event) -> None:
        role, state = str(e["role"]), str(e["state"])
        self._members[(role, int(e["rank"]))] = state
        if state == "lost":
            self.lost.labels(role).inc()
        for kind, gauge in (("server", self.live_servers), ("worker", self.live_workers)):
            gauge.set(sum(r == kind and s not in _GONE for (r, _), s in self._members.items()))

    def _on_failover(self, e: Event) -> None:
        self.failovers.inc()

    def _on_checkpoint(self, e: Event) -> None:
        self.checkpoints.inc()

    def _on_refused(self, e: Event) -> None:
        self.refused.labels(str(e["code"])).inc()
