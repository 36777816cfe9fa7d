"""The coordinator role: membership and heartbeats, the placement map, barriers,
broadcast relay, and job teardown. One per job."""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import threading
import time
from typing import Any

from trimtab.core.chunks import PlacementMap, TensorSpec, make_chunks
from trimtab.errors import ConfigError, JobAborted, ProtocolError
from trimtab.policies.batching import BATCHING, BatchSizingPolicy, WorkerSample
from trimtab.policies.detection import DEFAULT_DETECTOR, DETECTORS, StragglerDetector
from trimtab.policies.placement import PLACEMENTS, is_live
from trimtab.policies.psld import PsldController, SpeedEstimator, chunk_costs, rebalance
from trimtab.policies.scaling import DEFAULT_SCALING, SCALING, ScalingPolicy
from trimtab.protocol.messages import Control, ErrorCode, Header, decode, error_of, field
from trimtab.roles.coordinator.config import CoordinatorConfig
from trimtab.runtime.diagnostics import add_state_dump
from trimtab.runtime.loop import NodeLoop
from trimtab.transport import Peer, Transport, ZmqTransport

log = logging.getLogger("trimtab.coordinator")

#: Where no policy acts on every step's timings, workers report at most this often.
REPORT_EVERY_S = 0.05


@dataclasses.dataclass
class _Migration:
    """A migration in flight: servers still to acknowledge, chunks still moving."""

    epoch: int
    owners: tuple[int, ...]
    acks: set[int]
    cuts: dict[int, int]
    moving: set[int]


class Role(str, enum.Enum):
    SERVER = "server"
    WORKER = "worker"


@dataclasses.dataclass
class _Member:
    role: Role
    rank: int
    peer: Peer
    addr: str = ""
    last_seen: float = dataclasses.field(default_factory=time.monotonic)
    done: bool = False
    draining: bool = False  # a server giving its chunks away before it retires
    empty_at: int = 0  # the map epoch from which a draining server owns nothing
    placed: bool = False  # a server that was in the first map or has been given chunks
    # A worker's routing floor: the oldest map by which it may still have a data request
    # in flight (the ``lo`` of its MAP_GETs, REPORTs and heartbeats; the first map until
    # it says).
    floor: int = 0


class Coordinator:
    """Runs a job's control plane. :meth:`run` blocks until the job ends.

    Raises :class:`JobAborted` from :meth:`run` if a node died or the job was aborted.
    """

    def __init__(self, config: CoordinatorConfig, transport: Transport | None = None) -> None:
        self.config = config
        self._transport = transport or ZmqTransport(bind=True, host=config.host, port=config.port)
        self._loop = NodeLoop(config.job, self._transport, log)
        self._members: dict[Peer, _Member] = {}
        self._servers: list[_Member] = []
        self._workers: dict[int, _Member] = {}
        self._declared: dict[int, tuple[Peer, int, list[Any], dict[str, Any]]] = {}
        self._map: PlacementMap | None = None
        self._map_header: Header | None = None
        self._awaiting_acks: set[int] = set()
        self._barriers: dict[str, list[tuple[Peer, int]]] = {}
        self._bcast: dict[str, tuple[Header, list[memoryview], int]] = {}
        self._bcast_waiting: dict[str, list[tuple[Peer, int]]] = {}
        self._history: dict[int, collections.deque[WorkerSample]] = {}
        self._clocks: dict[int, int] = {}
        self._reports: dict[int, list[tuple[Peer, int, int, int]]] = {}
        self._batching: BatchSizingPolicy = BATCHING.create(config.batching)
        self._detector: StragglerDetector = DETECTORS.create(DEFAULT_DETECTOR)
        self._stop = False
        self._abort: str | None = None
        # Migration: at most one in flight; workers fetch the published map (MAP_GET).
        self._sizes: list[int] = []
        self._migrating: _Migration | None = None
        self._published: Header = {}
        self._map_waiters: list[tuple[Peer, int, int]] = []
        self._last_rebalance = 0
        self._speeds = SpeedEstimator()
        self._psld = (
            PsldController(min_servers=config.num_servers) if is_live(config.placement) else None
        )
        self._scaling: ScalingPolicy = SCALING.create(
            DEFAULT_SCALING,
            idle_steps=self._psld.window if self._psld else 5,
            min_servers=config.num_servers,
        )
        self._step_times: dict[int, float] = {}
        # Worker-observed traffic per clock, until every worker reported it:
        # clock -> (reports so far, server -> [longest span, shortest wait span, bytes]).
        self._traffic: dict[int, tuple[int, dict[int, list[float]]]] = {}
        self.migrations = 0
        self.bytes_moved = 0
        self._target_servers = config.num_servers

    @property
    def address(self) -> str:
        """Where nodes reach the coordinator."""
        return self._transport.address

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread; returns the thread."""
        thread = threading.Thread(target=self._run_logged, name="trimtab-coordinator", daemon=True)
        thread.start()
        return thread

    def abort(self, why: str) -> None:
        """Abort the job: every node is told to exit. Thread-safe; does not wait."""
        self._abort = why
        self._transport.wake()

    def _run_logged(self) -> None:
        try:
            self.run()
        except JobAborted as exc:
            log.warning("%s", exc)

    def run(self) -> None:
        """Serve until every worker is done. Blocks. Raises :class:`JobAborted`."""
        log.info(
            "coordinator of job %s at %s, waiting for %d servers and %d workers",
            self.config.job,
            self.address,
            self.config.num_servers,
            self.config.num_workers,
        )
        forget_state_dump = add_state_dump(self.describe)
        try:
            while not self._stop and self._abort is None:
                env = self._transport.recv(self.config.heartbeat_s)
                if env is not None:
                    self._dispatch(env.peer, env.frames)
                self._check_liveness()
            if self._abort is not None:
                for member in self._members.values():
                    self._loop.send(
                        member.peer, {"o": int(Control.ABORT), "i": 0, "why": self._abort}
                    )
        finally:
            forget_state_dump()
            self._transport.close()
        if self._abort is not None:
            raise JobAborted(self._abort)

    def describe(self) -> str:
        """Its protocol state, for a hung job's dump (:data:`STACK_SIGNAL`): the map, the
        migration in flight, each worker's clock and map, each server's state. Only
        reads; never blocks."""
        mig = self._migrating
        lines = [
            f"coordinator: map epoch {self._map.epoch if self._map else 0}, published "
            f"{self._published.get('epoch', '-')}, {len(self._map_waiters)} map requests "
            f"waiting, workers' clocks {dict(sorted(self._clocks.items()))}, workers' oldest maps "
            f"{ {r: w.floor for r, w in sorted(self._workers.items())} }"
        ]
        if mig is not None:
            lines.append(
                f"  migration to epoch {mig.epoch}: acks awaited from servers "
                f"{sorted(mig.acks)}, chunks not yet handed over {sorted(mig.moving)}, "
                f"cuts {dict(sorted(mig.cuts.items()))}"
            )
        for m in self._servers:
            state = "retired" if m.done else "draining" if m.draining else "active"
            owned = self._map.owners.count(m.rank) if self._map else 0
            lines.append(f"  server {m.rank} at {m.addr}: {state}, owns {owned} chunks")
        return "\n".join(lines)

    def _check_liveness(self) -> None:
        now = time.monotonic()
        for m in self._members.values():
            if not m.done and now - m.last_seen > self.config.dead_after_s:
                self._abort = (
                    f"{m.role.value} {m.rank} has been silent for "
                    f"{now - m.last_seen:.0f}s; stopping the job"
                )
                log.error(self._abort)
                return

    def _dispatch(self, peer: Peer, frames: list[memoryview]) -> None:
        rid = 0
        try:
            header = decode(frames[0], self.config.job)
            rid = header["i"]
            op = header["o"]
            member = self._members.get(peer)
            if member is not None:
                member.last_seen = time.monotonic()
            if op == Control.REGISTER:
                self._on_register(peer, header)
                return
            if member is None and op == Control.STATUS:  # tools need not register
                self._loop.send(peer, {"o": int(Control.OK), "i": rid, **self.status()})
                return
            if op == Control.SCALE:
                target = self.scale(field(header, "servers", int))
                self._loop.send(peer, {"o": int(Control.OK), "i": rid, "target": target})
                return
            if member is None:
                if op == Control.HEARTBEAT:
                    return  # a node's first heartbeat can overtake its REGISTER
                raise ProtocolError(
                    ErrorCode.BAD_STATE.value, f"op {op} before REGISTER; register first"
                )
            if op == Control.HEARTBEAT:
                self._loop.send(peer, {"o": int(Control.HEARTBEAT), "i": 0})
                self._on_floor(member, header)
            elif op == Control.DECLARE:
                self._on_declare(member, header)
            elif op == Control.MAP_ACK:
                self._awaiting_acks.discard(member.rank)
                self._maybe_release_map()
            elif op == Control.BARRIER:
                self._on_barrier(peer, header)
            elif op == Control.BCAST_PUT:
                self._on_bcast_put(peer, header, frames[1:])
            elif op == Control.BCAST_GET:
                self._on_bcast_get(peer, header)
            elif op == Control.REPORT:
                self._on_report(member, header)
            elif op == Control.DONE:
                self._on_done(member, rid)
            elif op == Control.STATUS:
                self._loop.send(peer, {"o": int(Control.OK), "i": rid, **self.status()})
            elif op == Control.MIGRATE_ACK:
                self._on_migrate_ack(member, header)
            elif op == Control.HANDED:
                self._on_handed(member, header)
            elif op == Control.MAP_GET:
                wanted = field(header, "e", int)
                self._on_floor(member, header)
                self._map_waiters.append((peer, rid, wanted))
                self._answer_map_waiters()
            elif op == Control.LOAD:
                if member.role is Role.SERVER:
                    self._speeds.observe(
                        member.rank,
                        float(field(header, "busy", (int, float))),
                        float(field(header, "bytes", (int, float))),
                    )
                    # The job's clock, so that a server owning nothing still knows the
                    # step (its straggler schedule, for one, follows it).
                    clock = min(self._clocks.values(), default=0)
                    self._loop.send(peer, {"o": int(Control.OK), "i": 0, "k": clock})
            else:
                raise ProtocolError(
                    ErrorCode.UNKNOWN_OP.value,
                    f"op {op} is not a control op the coordinator answers",
                )
        except ProtocolError as exc:
            code, msg = error_of(exc)
            self._loop.refuse(peer, rid, code, msg, data=False)
        except Exception as exc:
            log.exception("internal error on a request")
            self._loop.refuse(peer, rid, "internal", f"{type(exc).__name__}: {exc}", data=False)

    def status(self) -> dict[str, Any]:
        """Membership and placement, for tools and tests. Loop thread only."""
        return {
            "servers": [m.addr for m in self._servers],
            "workers": sorted(self._workers),
            "done": sorted(r for r, m in self._workers.items() if m.done),
            "epoch": self._map.epoch if self._map else 0,
            "owners": list(self._map.owners) if self._map else [],
            "clocks": {str(r): c for r, c in self._clocks.items()},
            "migrations": self.migrations,
            "bytes_moved": self.bytes_moved,
            "active_servers": [m.rank for m in self._active_servers()],
            "live_servers": [m.rank for m in self._servers if not m.done],
            "wanted_servers": self._wanted_servers(),
            "migrating": self._migrating is not None,
            "speeds": [self._speeds.speed(m.rank) for m in self._servers],
            # The workers' bounds (lower, upper or None for no bound) per server.
            "worker_speeds": [
                None
                if (b := self._speeds.observed(m.rank)) is None
                else [b[0], b[1] if b[1] != float("inf") else None]
                for m in self._servers
            ],
        }

    # -- membership ----------------------------------------------------------------

    def _on_register(self, peer: Peer, header: Header) -> None:
        role = field(header, "role", str)
        if peer in self._members:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "this node is already registered")
        if role == Role.SERVER.value:
            limit = self.config.num_servers if self._map is None else self._wanted_servers()
            if len(self._servers) >= limit:
                raise ProtocolError(
                    ErrorCode.BAD_STATE.value,
                    f"the job already has its {limit} servers"
                    + (
                        f" (it may grow to {self.config.max_servers} when asked)"
                        if self.config.max_servers > limit
                        else ""
                    ),
                )
            member = _Member(Role.SERVER, len(self._servers), peer, field(header, "addr", str))
            self._servers.append(member)
        elif role == Role.WORKER.value:
            rank = header.get("rank", -1)
            if not isinstance(rank, int) or rank < 0:
                rank = min(set(range(self.config.num_workers)) - set(self._workers), default=-1)
            if rank >= self.config.num_workers or rank < 0:
                raise ProtocolError(
                    ErrorCode.BAD_STATE.value,
                    f"no worker rank free (the job has {self.config.num_workers})",
                )
            if rank in self._workers:
                raise ProtocolError(ErrorCode.BAD_STATE.value, f"worker rank {rank} is taken")
            member = _Member(Role.WORKER, rank, peer)
            self._workers[rank] = member
        else:
            raise ProtocolError(ErrorCode.MALFORMED.value, f"unknown role {role!r}")
        self._members[peer] = member
        log.info("%s %d joined", member.role.value, member.rank)
        self._loop.send(
            peer,
            {
                "o": int(Control.REGISTERED),
                "i": header["i"],
                "rank": member.rank,
                "num_workers": self.config.num_workers,
                "num_servers": self.config.num_servers,
                "chunk_bytes": self.config.chunk_bytes,
                "heartbeat_s": self.config.heartbeat_s,
            },
        )
        if member.role is Role.SERVER and self._map is not None:
            self._rebalance_membership()  # a server joined a running job: give it chunks
        self._maybe_place()

    def _on_done(self, member: _Member, rid: int) -> None:
        member.done = True
        self._loop.send(member.peer, {"o": int(Control.OK), "i": rid})
        if len(self._workers) == self.config.num_workers and all(
            m.done for m in self._workers.values()
        ):
            log.info("every worker is done; shutting the job down")
            for server in self._servers:
                if not server.done:
                    self._loop.send(server.peer, {"o": int(Control.SHUTDOWN), "i": 0})
            self._stop = True

    # -- placement -----------------------------------------------------------------

    def _on_declare(self, member: _Member, header: Header) -> None:
        if member.role is not Role.WORKER:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "only workers declare tensors")
        if self._map is not None:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                "tensors were already declared: one DistributedOptimizer per job is supported",
            )
        tensors = field(header, "tensors", list)
        try:
            [TensorSpec.from_wire(t) for t in tensors]
        except ValueError as exc:
            raise ProtocolError(ErrorCode.MALFORMED.value, str(exc)) from None
        self._declared[member.rank] = (
            member.peer,
            header["i"],
            tensors,
            field(header, "opt", dict),
        )
        self._maybe_place()

    def _maybe_place(self) -> None:
        if (
            self._map is not None
            or len(self._declared) < self.config.num_workers
            or len(self._servers) < self.config.num_servers
        ):
            return
        first = self._declared[min(self._declared)]
        for rank, (_, _, tensors, _) in sorted(self._declared.items()):
            if tensors != first[2]:
                diff = _first_difference(first[2], tensors)
                for p, r, _, _ in self._declared.values():
                    self._loop.refuse(
                        p,
                        r,
                        ErrorCode.MISMATCH.value,
                        f"worker {rank} declared different tensors than worker "
                        f"{min(self._declared)}: {diff}",
                        data=False,
                    )
                self._declared.clear()
                return
        specs = [TensorSpec.from_wire(t) for t in first[2]]
        chunks = make_chunks(specs, self.config.chunk_bytes)
        self._sizes = [c.nbytes for c in chunks]
        policy = PLACEMENTS.create(self.config.placement)
        owners = policy.place(specs, chunks, len(self._servers))
        self._map = PlacementMap(1, tuple(owners), tuple(m.addr for m in self._servers))
        for m in self._servers:
            m.placed = True
        self._map_header = {
            "o": int(Control.MAP),
            "epoch": self._map.epoch,
            "tensors": first[2],
            "chunk_bytes": self.config.chunk_bytes,
            "owners": owners,
            "servers": list(self._map.servers),
            "opt": first[3],
            "workers": sorted(self._workers),
            "batching": self.config.batching,
            "consistency": self.config.consistency,
            "report_s": self._report_interval_s(),
            # Only a live placement reads the workers' per-server timings.
            "time_servers": self._psld is not None,
            "consistency_args": (
                {"staleness": self.config.staleness} if self.config.consistency == "ssp" else {}
            ),
        }
        log.info(
            "placed %d tensors in %d chunks over %d servers (%s)",
            len(specs),
            len(chunks),
            len(self._servers),
            self.config.placement,
        )
        self._awaiting_acks = {m.rank for m in self._servers}
        for server in self._servers:
            self._loop.send(server.peer, {**self._map_header, "i": 0})

    def _maybe_release_map(self) -> None:
        if self._awaiting_acks or self._map_header is None or not self._declared:
            return
        for peer, rid, _, _ in self._declared.values():
            self._loop.send(peer, {**self._map_header, "i": rid})
            self._members[peer].floor = self._map_header["epoch"]
        self._declared.clear()

    # -- step reports: batch sizing and straggler detection ----------------------

    def _report_interval_s(self) -> float:
        """How often workers report their step timings: every step where a policy acts
        on each one (LB-BSP's sizes, SaPS's directives, PSLD's and forced migrations,
        scaling), else at most every :data:`REPORT_EVERY_S`, so that jobs of very short
        steps do not spend a control round trip per step."""
        c = self.config
        per_step = (
            c.batching != "equal"
            or c.consistency == "saps"
            or is_live(c.placement)
            or c.rebalance_every > 0
            or c.max_servers > c.num_servers
        )
        return 0.0 if per_step else REPORT_EVERY_S

    def _on_report(self, member: _Member, header: Header) -> None:
        if member.role is not Role.WORKER:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "only workers report steps")
        clock = field(header, "k", int)
        try:
            sample = WorkerSample(
                rank=member.rank,
                batch=field(header, "b", int),
                compute_s=max(float(field(header, "cs", (int, float))), 1e-9),
                comm_s=max(float(field(header, "ms", (int, float))), 0.0),
                cpu_share=min(max(float(field(header, "cpu", (int, float))), 0.0), 1.0),
            )
        except ValueError as exc:
            raise ProtocolError(ErrorCode.MALFORMED.value, f"bad step report: {exc}") from None
        self._history.setdefault(member.rank, collections.deque(maxlen=50)).append(sample)
        self._clocks[member.rank] = clock + 1
        self._on_floor(member, header)
        self._step_times[clock] = max(
            self._step_times.get(clock, 0.0), sample.compute_s + sample.comm_s
        )
        if self._psld is not None:
            self._psld.observe_step(clock, sample.compute_s + sample.comm_s)
            self._observe_traffic(clock, header.get("sv", []))
        self._maybe_rebalance()
        epoch = self._published.get("epoch", 0)
        if self.config.batching == "equal":
            reply: Header = {"o": int(Control.OK), "i": header["i"], "epoch": epoch}
            if self.config.consistency == "saps":
                lagging = self._detector.stragglers(self._clocks)
                if member.rank in lagging:
                    reply.update(refresh=True, lead=max(self._clocks.values()))
            self._loop.send(member.peer, reply)
            return
        waiting = self._reports.setdefault(clock, [])
        waiting.append((member.peer, header["i"], member.rank, sample.batch))
        if len(waiting) < self.config.num_workers:
            return
        del self._reports[clock]
        total = sum(b for _, _, _, b in waiting)
        sizes = self._batching.batch_sizes({r: list(h) for r, h in self._history.items()}, total)
        vector = [sizes[r] for r in range(self.config.num_workers)]
        for peer, rid, _, _ in waiting:
            self._loop.send(peer, {"o": int(Control.OK), "i": rid, "sizes": vector, "epoch": epoch})

    def _observe_traffic(self, clock: int, spans: Any) -> None:
        """Take one worker's per-server spans of step ``clock`` (``[[server, from first
        push, from the wait, bytes], ...]``, see the optimizer's ``_spans_of_step``);
        once every worker's are in, give the step's figures of each server to the speed
        estimator: its bytes of all workers over the longest first span (a lower bound
        of its speed) and over the shortest wait span (the worker that pushed last
        waited least for others). Raises :class:`ProtocolError` for a malformed list."""
        rows: list[tuple[int, float, float, float]] = []
        try:
            for row in spans:
                server, span, tail, nbytes = row
                if not isinstance(server, int) or not 0 <= server < len(self._servers):
                    raise ValueError(f"no server {server!r}")
                rows.append((server, float(span), float(tail), float(nbytes)))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"bad per-server spans in a step report: {exc}"
            ) from None
        reports, servers = self._traffic.get(clock, (0, {}))
        for server, span, tail, nbytes in rows:
            seen = servers.setdefault(server, [0.0, float("inf"), 0.0])
            seen[0] = max(seen[0], span)
            seen[1] = min(seen[1], tail)
            seen[2] += nbytes
        if reports + 1 < self.config.num_workers:
            self._traffic[clock] = (reports + 1, servers)
            for old in [k for k in self._traffic if k < clock - 8]:
                del self._traffic[old]  # a step some worker never reported
            return
        self._traffic.pop(clock, None)
        for server, (span, tail, nbytes) in servers.items():
            self._speeds.observe_step(server, nbytes, span, tail)

    # -- live migration --------------------------------------------------------------

    def _maybe_rebalance(self) -> None:
        """At a step boundary (every worker reported the step): ask the policy."""
        if self._map is None or self._migrating is not None or not self._clocks:
            return
        if len(self._clocks) < self.config.num_workers:
            return
        clock = min(self._clocks.values())
        if clock <= self._last_rebalance:
            return
        new: tuple[int, ...] | None = None
        every = self.config.rebalance_every
        active = self._active_mask()
        if every and clock - self._last_rebalance >= every:
            live = [s for s, a in enumerate(active) if a]
            new = tuple(live[(live.index(o) + 1) % len(live)] for o in self._map.owners)
        elif self._psld is not None:
            costs = chunk_costs(self._sizes, self.config.num_workers)
            speeds = self._speeds.speeds(len(self._servers))
            probe = frozenset(self._speeds.unknown(len(self._servers)))
            new = self._psld.decide(
                clock, costs, self._map.owners, speeds, active=active, probe=probe
            )
            grow = len(self._active_servers()) < self.config.max_servers
            wanted = len(self._active_servers()) + 1
            if (
                grow
                and self._target_servers < wanted
                and self._scaling.wants_server(speeds, active)
            ):
                self._target_servers = wanted
                log.info("psld: a server straggles; asking for server %d", len(self._servers))
            lasting = self._speeds.lasting(len(self._servers))
            idle = self._scaling.idle_server(
                clock, self._map.owners, active, lasting, settled=not self._psld.trial_running
            )
            if new is None and idle is not None:
                log.info(
                    "psld: server %d owns nothing and was found slow again each time it "
                    "was re-measured (%d times): it retires",
                    idle,
                    self._speeds.slow_rechecks(idle),
                )
                self._drain(self._servers[idle])
                self._target_servers = len(self._active_servers())
                self._rebalance_membership()
                return
        if new is not None and new != self._map.owners:
            self._last_rebalance = clock
            if self._psld is not None and speeds is not None:
                seen = [self._speeds.observed(s) for s in range(len(self._servers))]
                bounds = [None if v is None else [round(x / 1e6, 1) for x in v] for v in seen]
                log.info(
                    "psld at clock %d: speeds %s MB/s (workers saw between %s), chunks per server "
                    "%s -> %s",
                    clock,
                    [round(v / 1e6, 1) for v in speeds],
                    bounds,
                    [self._map.owners.count(s) for s in range(len(self._servers))],
                    [new.count(s) for s in range(len(self._servers))],
                )
            self.migrate(new)

    # -- elastic servers -------------------------------------------------------------

    def _active_servers(self) -> list[_Member]:
        return [m for m in self._servers if not m.done and not m.draining]

    def _active_mask(self) -> list[bool]:
        return [not m.done and not m.draining for m in self._servers]

    def _wanted_servers(self) -> int:
        """How many server processes the job wants started (the launcher polls it):
        those registered plus those the target still lacks."""
        lacking = max(0, self._target_servers - len(self._active_servers()))
        return len(self._servers) + lacking

    def scale(self, servers: int) -> int:
        """Go to ``servers`` active servers (bounded by 1 and ``max_servers``): more are
        asked of the launcher (``wanted_servers`` in :meth:`status`), fewer are drained
        (their chunks move away, then they are told to exit). Returns the target.
        Loop thread only; never blocks."""
        if self.config.consistency != "bsp":
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"scaling moves chunks at a synchronous step boundary; this job runs "
                f"--mode {self.config.consistency}, so it cannot scale",
            )
        target = min(max(1, servers), self.config.max_servers)
        self._target_servers = target
        active = self._active_servers()
        if len(active) > target:
            # The slowest measured go first; unmeasured ones count as fast.
            speeds = self._speeds.speeds(len(self._servers)) or [1.0] * len(self._servers)
            active.sort(key=lambda m: -speeds[m.rank])
            for m in active[target:]:
                self._drain(m)
            self._rebalance_membership()
        return target

    @staticmethod
    def _drain(m: _Member) -> None:
        m.draining = True
        log.info("server %d drains: its chunks move away, then it exits", m.rank)

    def _rebalance_membership(self) -> None:
        """A server joined or is draining: move chunks onto (off) it now."""
        if self._map is None or self._migrating is not None:
            return  # retried when the migration in flight finishes
        active = self._active_mask()
        owners = self._map.owners
        if not any(a for a in active):
            return
        n = len(self._servers)
        speeds = self._speeds.speeds(n) or [1.0] * n
        costs = chunk_costs(self._sizes, self.config.num_workers)
        plan = rebalance(costs, owners, speeds, active=active)
        if plan.owners != owners:
            self.migrate(plan.owners)
        else:
            self._retire_drained()

    def _on_floor(self, member: _Member, header: Header) -> None:
        """A worker's ``lo`` (in MAP_GET, REPORT and heartbeats): the oldest map by which
        it still has a request in flight. Raises a MALFORMED :class:`ProtocolError` if it
        is not an integer."""
        if member.role is not Role.WORKER or "lo" not in header:
            return
        floor = field(header, "lo", int)
        if floor > member.floor:
            member.floor = floor
            self._retire_drained()

    def _retire_drained(self) -> None:
        """Stop draining servers that own nothing, once no worker has a request in flight
        that an older map routed (each worker's ``lo``): until then such a request may
        still reach them, and they answer it *moved*. Having sent a worker the newer map
        is not enough: requests it sent by the old one may not have been read yet, and a
        server stopped before reading them leaves their sender waiting forever."""
        if self._map is None:
            return
        owned = set(self._map.owners)
        known = min(
            (w.floor for w in self._workers.values() if not w.done), default=self._map.epoch
        )
        for m in self._servers:
            if not m.draining or m.done or m.rank in owned:
                continue
            if not m.empty_at:
                m.empty_at = self._map.epoch
            if known >= m.empty_at:
                log.info("server %d owns nothing now: it retires", m.rank)
                m.done = True
                self._loop.send(m.peer, {"o": int(Control.SHUTDOWN), "i": 0})

    def migrate(self, owners: tuple[int, ...]) -> None:
        """Start moving chunks to ``owners``: every server learns the new map and says
        from which clock each chunk it gives away is its new owner's. Loop thread only.
        Raises :class:`ConfigError` if a migration is in flight or no map exists yet."""
        if self._map is None or self._map_header is None:
            raise ConfigError("no placement yet: tensors are not declared")
        if self._migrating is not None:
            raise ConfigError(f"migration to epoch {self._migrating.epoch} still in flight")
        if len(owners) != len(self._map.owners) or not all(
            0 <= o < len(self._servers) for o in owners
        ):
            raise ConfigError("a new map must name a live server for every chunk")
        epoch = self._map.epoch + 1
        moving = {
            c for c, (a, b) in enumerate(zip(self._map.owners, owners, strict=True)) if a != b
        }
        live = [m for m in self._servers if not m.done]
        if any(self._servers[o].done for o in owners):
            raise ConfigError("a new map gives chunks to a retired server")
        self._migrating = _Migration(epoch, tuple(owners), {m.rank for m in live}, {}, moving)
        log.info(
            "migration to epoch %d at step %d: %d chunks (%d bytes) move",
            epoch,
            min(self._clocks.values(), default=0),
            len(moving),
            sum(self._sizes[c] for c in moving),
        )
        header = {
            **self._map_header,
            "o": int(Control.MIGRATE),
            "i": 0,
            "epoch": epoch,
            "owners": list(owners),
            "servers": [m.addr for m in self._servers],
        }
        for server in live:
            self._loop.send(server.peer, header)

    def _on_migrate_ack(self, member: _Member, header: Header) -> None:
        mig = self._migrating
        if mig is None or field(header, "epoch", int) != mig.epoch:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "no such migration in flight")
        for cid, cut in field(header, "cuts", dict).items():
            mig.cuts[int(cid)] = int(cut)
        mig.acks.discard(member.rank)
        if mig.acks or self._map is None:
            return
        previous = self._map.owners
        self._map = PlacementMap(mig.epoch, mig.owners, tuple(m.addr for m in self._servers))
        for rank in set(mig.owners):
            self._servers[rank].placed = True
        self._published = {
            "epoch": mig.epoch,
            "owners": list(mig.owners),
            "servers": list(self._map.servers),
            "prev": list(previous),
            "cuts": {str(c): k for c, k in mig.cuts.items()},
        }
        self._answer_map_waiters()
        self._finish_migration_if_done()

    def _on_handed(self, member: _Member, header: Header) -> None:
        mig = self._migrating
        if mig is None:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "no migration in flight")
        for cid in field(header, "c", list):
            if cid in mig.moving:
                mig.moving.discard(cid)
                self.bytes_moved += self._sizes[cid]
        self._finish_migration_if_done()

    def _finish_migration_if_done(self) -> None:
        mig = self._migrating
        if mig is None or mig.acks or mig.moving:
            return
        self.migrations += 1
        self._migrating = None
        log.info(
            "migration to epoch %d done at step %d (%d so far)",
            mig.epoch,
            min(self._clocks.values(), default=0),
            self.migrations,
        )
        self._retire_drained()
        # A server draining, or one that joined during the migration (not yet given
        # anything), is handled now. A server the policy emptied on purpose is not
        # refilled here: that is the policy's to decide (or to retire it).
        if any(m.draining and not m.done for m in self._servers) or any(
            not m.placed for m in self._active_servers()
        ):
            self._rebalance_membership()

    def _answer_map_waiters(self) -> None:
        published = self._published.get("epoch", self._map.epoch if self._map else 0)
        keep = []
        for peer, rid, epoch in self._map_waiters:
            if epoch > published:
                keep.append((peer, rid, epoch))
                continue
            body = self._published or {
                "epoch": published,
                "owners": list(self._map.owners) if self._map else [],
                "servers": list(self._map.servers) if self._map else [],
                "prev": [],
                "cuts": {},
            }
            self._loop.send(peer, {"o": int(Control.MAP), "i": rid, **body})
        self._map_waiters = keep

    # -- barriers and broadcast ----------------------------------------------------

    def _on_barrier(self, peer: Peer, header: Header) -> None:
        name = field(header, "name", str)
        arrived = self._barriers.setdefault(name, [])
        arrived.append((peer, header["i"]))
        if len(arrived) == self.config.num_workers:
            for p, r in arrived:
                self._loop.send(p, {"o": int(Control.OK), "i": r})
            del self._barriers[name]

    def _on_bcast_put(self, peer: Peer, header: Header, frames: list[memoryview]) -> None:
        key = field(header, "key", str)
        meta = field(header, "meta", dict)
        if key in self._bcast:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"broadcast {key!r} was already put")
        self._bcast[key] = (meta, frames, 0)
        self._loop.send(peer, {"o": int(Control.OK), "i": header["i"]})
        for p, r in self._bcast_waiting.pop(key, []):
            self._send_bcast(p, r, key)

    def _on_bcast_get(self, peer: Peer, header: Header) -> None:
        key = field(header, "key", str)
        if key in self._bcast:
            self._send_bcast(peer, header["i"], key)
        else:
            self._bcast_waiting.setdefault(key, []).append((peer, header["i"]))

    def _send_bcast(self, peer: Peer, rid: int, key: str) -> None:
        meta, frames, served = self._bcast[key]
        self._loop.send(peer, {"o": int(Control.BCAST_VALUE), "i": rid, "meta": meta}, frames)
        if served + 1 >= self.config.num_workers - 1:
            del self._bcast[key]
        else:
            self._bcast[key] = (meta, frames, served + 1)


def _first_difference(a: list[Any], b: list[Any]) -> str:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return f"{x} vs {y}"
    return f"{len(a)} tensors vs {len(b)}"
