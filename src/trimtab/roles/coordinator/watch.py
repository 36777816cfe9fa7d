"""What fills the coordinator's event stream (:mod:`.events`): the step and load reports
as they arrive, requests refused, and, after every batch of messages the coordinator
sends, what changed in its state since the last batch: the published map, migrations,
members, the servers wanted, failovers, checkpoints, and the SaPS directives and batch
sizes in the messages themselves. Reading the state after each batch, rather than
calling out from every piece that changes it, keeps the pieces as they are: pure
operations that return messages. Loop thread only; never blocks.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from trimtab.policies.batching import WorkerSample
from trimtab.policies.psld import SpeedEstimator
from trimtab.roles.coordinator.checkpoint import Checkpoints
from trimtab.roles.coordinator.config import CoordinatorConfig
from trimtab.roles.coordinator.events import Events
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.roles.coordinator.rebalance import Rebalancer
from trimtab.roles.coordinator.recovery import Recovery
from trimtab.roles.coordinator.steps import Steps

#: A server whose estimated speed falls below this share of the median of the others'
#: is reported a straggler (once, until it recovers above it).
SLOW_SHARE = 0.5


class Watch:
    """Emits the coordinator's events into ``events`` (see the module docstring).

    Args:
        events: the stream.
        members, maps, steps, rebalancer: the coordinator's pieces, read only (and
            those :meth:`started` gives).
    """

    def __init__(
        self, events: Events, members: Members, maps: Maps, steps: Steps, rebalancer: Rebalancer
    ) -> None:
        self.events = events
        self._members = members
        self._maps = maps
        self._steps = steps
        self._rebalancer = rebalancer
        self._speeds = SpeedEstimator()
        self._failovers: Callable[[], int] = lambda: 0
        self._checkpoint: Callable[[], str | None] = lambda: None
        self._epoch = 0
        self._migrating: int | None = None
        self._migrations = 0
        self._states: dict[tuple[str, int], str] = {}
        self._wanted = members.target_servers
        self._failover_count = 0
        self._last_checkpoint: str | None = None
        self._slow: set[int] = set()

    def started(
        self,
        config: CoordinatorConfig,
        speeds: SpeedEstimator,
        recovery: Recovery,
        checkpoints: Checkpoints,
    ) -> None:
        """The coordinator of the job ``config`` describes starts: emit the ``job``
        event; from now on read the servers' ``speeds``, the failovers of ``recovery``
        and the newest checkpoint of ``checkpoints``."""
        self._speeds = speeds
        self._failovers = lambda: recovery.failovers
        self._checkpoint = lambda: checkpoints.last_checkpoint
        self.events.emit(
            "job",
            job=config.job,
            workers=config.num_workers,
            servers=config.num_servers,
            placement=config.placement,
            consistency=config.consistency,
            batching=config.batching,
            chunk_bytes=config.chunk_bytes,
        )

    def step(self, rank: int, clock: int, sample: WorkerSample) -> None:
        """Worker ``rank`` reported step ``clock``."""
        lead = max(self._steps.clocks.values(), default=clock + 1)
        self.events.emit(
            "step",
            rank=rank,
            clock=clock,
            batch=sample.batch,
            compute_s=sample.compute_s,
            comm_s=sample.comm_s,
            cpu=sample.cpu_share,
            lag=max(0, lead - (clock + 1)),
        )

    def traffic(self, clock: int, figures: dict[int, tuple[float, float, float]] | None) -> None:
        """Every worker reported its per-server spans of step ``clock`` (``figures``,
        :meth:`Steps.observe_traffic`'s; None: not every worker yet, nothing is emitted):
        the figures PSLD's speed estimator takes, for the run record, in every run (the
        simulator draws its measurement noise from them)."""
        if figures:
            rows = [[s, span, wait, nbytes] for s, (span, wait, nbytes) in sorted(figures.items())]
            self.events.emit("traffic", clock=clock, servers=rows)

    def load(
        self,
        server: int,
        busy_s: float,
        nbytes: float,
        requests: int,
        out: int | None = None,
        growing: dict[str, int] | None = None,
    ) -> None:
        """Server ``server`` reported its cumulative load (``out``: of its bytes, those
        it sent, where it says; ``growing``: its growing tables' counters); a server
        whose speed figure fell below :data:`SLOW_SHARE` of the others' median is
        reported a straggler."""
        speed = self._speeds.speed(server)
        split = {} if out is None else {"bytes_in": nbytes - out, "bytes_out": out}
        extra = {"growing": growing} if growing else {}
        self.events.emit(
            "load",
            server=server,
            busy_s=busy_s,
            bytes=nbytes,
            **split,
            requests=requests,
            speed=speed,
            **extra,
        )
        active = [m.rank for m in self._members.active_servers()]
        others = [v for r in active if r != server and (v := self._speeds.speed(r)) is not None]
        if speed is None or not others:
            return
        slow = speed < SLOW_SHARE * statistics.median(others)
        if slow and server not in self._slow:
            self._slow.add(server)
            ratio = speed / statistics.median(others)
            self.events.emit(
                "straggler",
                role="server",
                rank=server,
                why=f"its speed is {ratio:.0%} of the other servers' median",
            )
        elif not slow:
            self._slow.discard(server)

    @property
    def slow_servers(self) -> list[int]:
        """The servers reported stragglers and not recovered since."""
        return sorted(self._slow)

    def refused(self, code: str, msg: str) -> None:
        """A request was answered with an ERROR."""
        self.events.emit("refused", code=code, msg=msg)

    def sent(self, out: Outbox) -> None:
        """The coordinator sends ``out``: emit the directives in it and the state
        changes since the last call."""
        for m in out:
            if not isinstance(m, Send):
                continue
            header: Any = m.header
            if header.get("refresh"):
                member = self._members.by_peer.get(m.peer)
                rank = member.rank if member is not None else -1
                self.events.emit("saps", rank=rank, lead=header.get("lead"))
                self.events.emit(
                    "straggler", role="worker", rank=rank, why="SaPS: it lags the leader"
                )
        sized: list[Any] = [m.header for m in out if isinstance(m, Send) and "sizes" in m.header]
        if sized:
            self.events.emit("batch_sizes", sizes=list(sized[0]["sizes"]))
        self._changes()

    def _changes(self) -> None:
        self._members_changed()
        rb, maps = self._rebalancer, self._maps
        moving = rb.migrating
        if moving is not None and moving.epoch != self._migrating:
            current = maps.map
            chunks = [c for c in moving.moving] if moving.moving else []
            if not chunks and current is not None:
                chunks = [c for c, o in enumerate(moving.owners) if o != current.owners[c]]
            self.events.emit(
                "migration",
                phase="start",
                epoch=moving.epoch,
                chunks=len(chunks),
                bytes=sum(maps.sizes[c] for c in chunks if c < len(maps.sizes)),
                migrations=rb.migrations,
                bytes_moved=rb.bytes_moved,
            )
        if moving is None and self._migrating is not None:
            phase = "done" if rb.migrations > self._migrations else "abandoned"
            self.events.emit(
                "migration",
                phase=phase,
                epoch=self._migrating,
                chunks=0,
                bytes=0,
                migrations=rb.migrations,
                bytes_moved=rb.bytes_moved,
            )
        self._migrating = moving.epoch if moving is not None else None
        self._migrations = rb.migrations
        current = maps.map  # (the first map, or one a migration published, once held)
        published = current.epoch if current is not None else 0
        if published != self._epoch and current is not None and not maps.pending:
            self._epoch = published
            n = len(self._members.servers)
            owners = list(current.owners)
            bytes_of = [0] * n
            for c, o in enumerate(owners):
                if o < n and c < len(maps.sizes):
                    bytes_of[o] += maps.sizes[c]
            self.events.emit(
                "placement",
                epoch=published,
                chunks=[owners.count(s) for s in range(n)],
                bytes=bytes_of,
                owners=owners,
            )
        if self._members.target_servers != self._wanted:
            self._wanted = self._members.target_servers
            self.events.emit("servers_wanted", target=self._wanted)
        failovers = self._failovers()
        if failovers != self._failover_count:
            self._failover_count = failovers
            self.events.emit("failover", failovers=failovers, epoch=published)
        checkpoint = self._checkpoint()
        if checkpoint != self._last_checkpoint and checkpoint is not None:
            self._last_checkpoint = checkpoint
            self.events.emit("checkpoint", path=checkpoint)

    def _members_changed(self) -> None:
        members = [*self._members.servers, *self._members.workers.values()]
        for m in members:
            key = (m.role.value, m.rank)
            if self._states.get(key) != m.state.value:
                self._states[key] = m.state.value
                where = {"addr": m.addr} if m.addr else {}  # a server's: the host it is on
                self.events.emit(
                    "member", role=m.role.value, rank=m.rank, state=m.state.value, **where
                )
