"""The coordinator role's loop: receives control messages, dispatches each by op to a
handler, sends what the handler's pieces return, and watches for silent members. One
per job.

The pieces, each testable without threads or sockets: :mod:`.members` (membership and
server states), :mod:`.maps` (declarations, placement, the published map),
:mod:`.migration` and :mod:`.rebalance` (moving chunks live), :mod:`.steps` (step
reports), :mod:`.collectives` (barriers, broadcasts and Horovod's collectives). Each
op's handler is in :mod:`.ops`, the members lost and joining in :mod:`.lost`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from trimtab.errors import JobAborted, ProtocolError
from trimtab.policies.batching import BATCHING
from trimtab.policies.consistency import CONSISTENCY
from trimtab.policies.detection import DEFAULT_DETECTOR, DETECTORS
from trimtab.policies.placement import PLACEMENTS
from trimtab.policies.psld import PsldController, SpeedEstimator
from trimtab.policies.scaling import DEFAULT_SCALING, SCALING
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, ErrorCode, Header, decode, error_of
from trimtab.roles.coordinator.checkpoint import Checkpoints
from trimtab.roles.coordinator.collectives import Collectives
from trimtab.roles.coordinator.config import CoordinatorConfig
from trimtab.roles.coordinator.dump import describe, status
from trimtab.roles.coordinator.events import Events
from trimtab.roles.coordinator.liveness import Liveness
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Member, Members, Role
from trimtab.roles.coordinator.ops import MemberOps
from trimtab.roles.coordinator.outbox import Outbox, Refuse
from trimtab.roles.coordinator.rebalance import Rebalancer
from trimtab.roles.coordinator.recovery import Recovery
from trimtab.roles.coordinator.rejoin import Rejoins
from trimtab.roles.coordinator.steps import Steps, report_interval_s
from trimtab.roles.coordinator.watch import Watch
from trimtab.runtime import credentials
from trimtab.runtime.diagnostics import add_state_dump
from trimtab.runtime.loop import NodeLoop
from trimtab.transport import Peer, Transport, ZmqTransport

log = logging.getLogger("trimtab.coordinator")


_BOTH = frozenset({Role.WORKER, Role.SERVER})

#: A handler of a registered member's op: (member, header, frames after the header, the
#: messages to send, appended to).
Handler = Callable[[Member, Header, list[memoryview], Outbox], None]


class Coordinator(MemberOps):
    """Runs a job's control plane. :meth:`run` blocks until the job ends.

    Raises :class:`JobAborted` from :meth:`run` if a node died or the job was aborted.
    """

    def __init__(self, config: CoordinatorConfig, transport: Transport | None = None) -> None:
        self.config = config
        self._transport = transport or ZmqTransport(bind=True, host=config.host, port=config.port)
        self._loop = NodeLoop(config.job, self._transport, log)
        self._stop = False
        self._abort: str | None = None
        placement = PLACEMENTS.create(config.placement)
        consistency = CONSISTENCY.create(config.consistency, workers=config.num_workers)
        batching = BATCHING.create(config.batching)
        psld = PsldController(min_servers=config.num_servers) if placement.live else None
        per_step = (
            batching.adaptive
            or consistency.skips_stragglers
            or placement.live
            or config.rebalance_every > 0
            or config.max_servers > config.num_servers
            or config.settings().elastic_workers
        )
        terms: dict[str, Any] = {
            "batching": config.batching,
            "consistency": config.consistency,
            "report_s": report_interval_s(per_step),
            "time_servers": True,  # PSLD reads them; every run's record keeps them (traffic)
            "consistency_args": consistency.job_args(config.staleness),
            "elastic": config.settings().elastic_workers and consistency.synchronous,
        }
        self._members = Members(config.num_workers, config.num_servers, config.max_servers)
        self._maps = Maps(placement, config.chunk_bytes, terms)
        self._steps = Steps(
            config.num_workers,
            batching,
            DETECTORS.create(DEFAULT_DETECTOR),
            skips_stragglers=consistency.skips_stragglers,
        )
        self._speeds = SpeedEstimator()
        self._rebalancer = Rebalancer(
            self._members,
            self._maps,
            self._speeds,
            psld,
            SCALING.create(
                DEFAULT_SCALING,
                idle_steps=psld.window if psld else 0,
                min_servers=config.num_servers,
            ),
            rotate_every=config.rebalance_every,
            synchronous=consistency.synchronous,
            mode=config.consistency,
            job_clock=lambda: self._steps.job_clock,
        )
        self._collectives = Collectives(config.num_workers)
        self._elastic = self._make_elastic(batching, consistency.synchronous)
        self._recovery = Recovery(self._members, self._maps, config.replicas, self._rebalancer)
        self._liveness = Liveness(config.dead_after_s)
        # A replacement coordinator's first phase: the members come back (REJOIN).
        self._rejoins = Rejoins.of(config) if config.rejoin else None
        #: The member key: every member's credential is made from it (REGISTERED).
        self._key = credentials.new_key()
        self._ticket = (
            credentials.join_ticket(config.server_key, config.job) if config.server_key else None
        )
        # Ops anyone who passed the transport's authentication may send, registered or
        # not (tools need not register): STATUS and SCALE are a tool's, and REGISTER
        # admits a server only if the job wants one and it shows the join ticket.
        self._open: dict[int, Callable[[Peer, Header, Outbox], None]] = {
            Control.REGISTER: self._on_register,
            Control.STATUS: self._on_status,
            Control.SCALE: self._on_scale,
            Control.SCALE_WORKERS: self._on_scale_workers,
            Control.REJOIN: self._on_rejoin,
        }
        both, worker, server = _BOTH, frozenset({Role.WORKER}), frozenset({Role.SERVER})
        # Each member op, and the roles that may send it.
        self._handlers: dict[int, tuple[Handler, frozenset[Role]]] = {
            Control.HEARTBEAT: (self._on_heartbeat, both),
            Control.DECLARE: (self._on_declare, worker),
            Control.MAP_ACK: (self._on_map_ack, server),
            Control.BARRIER: (self._on_barrier, worker),
            Control.ADOPT: (self._on_adopt, worker),
            Control.BCAST_PUT: (self._on_bcast_put, worker),
            Control.BCAST_GET: (self._on_bcast_get, worker),
            Control.GATHER: (self._on_gather, worker),
            Control.REPORT: (self._on_report, worker),
            Control.DONE: (self._on_done, worker),
            Control.LEAVE: (self._on_leave, worker),
            Control.MIGRATE_ACK: (self._on_migrate_ack, server),
            Control.HANDED: (self._on_handed, server),
            Control.MAP_GET: (self._on_map_get, worker),
            Control.LOAD: (self._on_load, server),
            Control.WORKERS_ACK: (self._on_workers_ack, server),
            Control.FAILOVER_ACK: (self._recovery.on_ack, server),
            Control.HELD: (self._on_held, server),
        }
        self.checkpoints = Checkpoints(config, self._members, self._maps, self._steps)
        self.checkpoints.register(self._open, self._handlers, self._rebalancer, self.abort)
        self.events = Events()  # the job's event stream, which the live view reads
        self.watch = Watch(self.events, self._members, self._maps, self._steps, self._rebalancer)
        self.watch.started(config, self._speeds, self._recovery, self.checkpoints)

    @property
    def address(self) -> str:
        """Where nodes reach the coordinator."""
        return self._transport.address

    @property
    def migrations(self) -> int:
        """Migrations finished so far."""
        return self._rebalancer.migrations

    @property
    def bytes_moved(self) -> int:
        """Bytes of chunks handed over between servers so far."""
        return self._rebalancer.bytes_moved

    def migrate(self, owners: tuple[int, ...]) -> None:
        """Start moving chunks to ``owners``: every server learns the new map and says
        from which clock each chunk it gives away is its new owner's. Loop thread only.
        Raises :class:`UsageError` if a migration is in flight, no map exists yet, or
        ``owners`` gives a chunk to no server or a retired one."""
        out: Outbox = []
        try:
            self._rebalancer.migrate(owners, out)
        finally:
            self._send(out)

    def scale(self, servers: int) -> int:
        """Go to ``servers`` active servers (bounded by 1 and ``max_servers``): more are
        asked of the launcher (``wanted_servers`` in :meth:`status`), fewer are drained
        (their chunks move away, then they are told to exit). Returns the target.
        Loop thread only; never blocks. Raises :class:`ProtocolError` (BAD_STATE) unless
        the job's consistency is synchronous."""
        out: Outbox = []
        try:
            return self._rebalancer.scale(servers, out)
        finally:
            self._send(out)

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread; returns the thread."""
        thread = threading.Thread(target=self._run_logged, name="trimtab-coordinator", daemon=True)
        thread.start()
        return thread

    def _on_held(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        why = self._recovery.on_held(member, header, out)
        if why is not None:
            self.abort(why)

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
                env = self._transport.recv(self._liveness.wait_s(self.config.heartbeat_s))
                if env is not None:
                    self._dispatch(env.peer, env.frames)
                for member, why in self._liveness.lost(self._members, self._transport.lost()):
                    self.member_lost(member, why)
                if self._rejoins is not None:
                    self._send(self._rejoin_poll([]))
            self.events.emit("end", why=self._abort)
            if self._abort is not None:
                for member in self._members.by_peer.values():
                    self._loop.send(member.peer, headers.abort(why=self._abort))
        finally:
            forget_state_dump()
            self._transport.close()
        if self._abort is not None:
            raise JobAborted(self._abort)

    def describe(self) -> str:
        """Its protocol state, for a hung job's dump (:data:`STACK_SIGNAL`): see
        :func:`.dump.describe`. Only reads; never blocks."""
        return describe(self._maps, self._rebalancer, self._members, self._steps, self._collectives)

    def _dispatch(self, peer: Peer, frames: list[memoryview]) -> None:
        """Handle one message. What the handler produced is sent even if it then failed
        (its state changes stand); a failure is answered with an ERROR."""
        rid = 0
        out: Outbox = []
        try:
            header = decode(frames[0], self.config.job)
            rid = header["i"]
            op = header["o"]
            member = self._members.by_peer.get(peer)
            if member is not None:
                member.last_seen = time.monotonic()
            opener = self._open.get(op)
            if opener is not None:
                opener(peer, header, out)
                return
            if member is None:
                if op == Control.HEARTBEAT or (self._rejoins and not self._rejoins.rebuilt):
                    return  # it can overtake a node's REGISTER (or a member's REJOIN)
                raise ProtocolError(
                    ErrorCode.BAD_STATE.value, f"op {op} before REGISTER; register first"
                )
            entry = self._handlers.get(op)
            if entry is None:
                raise ProtocolError(
                    ErrorCode.UNKNOWN_OP.value,
                    f"op {op} is not a control op the coordinator answers",
                )
            handler, roles = entry
            if member.role not in roles:
                raise credentials.forbidden(
                    f"op {op} is not a {member.role.value}'s to send (it is a "
                    f"{' or '.join(sorted(r.value for r in roles))}'s)"
                )
            handler(member, header, frames[1:], out)
        except ProtocolError as exc:
            code, msg = error_of(exc)
            out.append(Refuse(peer, rid, code, msg))
            self.watch.refused(code, msg)
        except Exception as exc:
            log.exception("internal error on a request")
            out.append(Refuse(peer, rid, ErrorCode.INTERNAL.value, f"{type(exc).__name__}: {exc}"))
        finally:
            self._send(out)

    def _send(self, out: Outbox) -> None:
        self.watch.sent(out)
        for m in out:
            if isinstance(m, Refuse):
                self._loop.refuse(m.peer, m.rid, m.code, m.msg, data=False)
            else:
                self._loop.send(m.peer, m.header, m.frames)

    def status(self) -> dict[str, Any]:
        """Membership and placement, for tools and tests (see :func:`.dump.status`).
        Loop thread only."""
        return {
            **status(self._members, self._maps, self._steps, self._rebalancer, self._speeds),
            **self._elastic_status(),
            "failovers": self._recovery.failovers,
            "last_checkpoint": self.checkpoints.last_checkpoint,  # the newest complete one
            "rejoining": self._rejoins.missing() if self._rejoins else [],
        }
