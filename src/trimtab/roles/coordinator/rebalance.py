"""Moving chunks while the job runs: at step boundaries, asks the policies (forced
rotation, PSLD, server scaling) whether chunks should move or servers come or go, and
runs the migration that follows (:mod:`.migration`), retiring drained servers after.

Every operation appends the messages to send to an ``out`` list rather than returning
them: several state changes follow one another, and the messages of those done before
an error must still be sent (a server marked retired must get its SHUTDOWN).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from trimtab.errors import ProtocolError, UsageError
from trimtab.policies import replicas
from trimtab.policies.psld import PsldController, SpeedEstimator, chunk_costs, rebalance
from trimtab.policies.scaling import ScalingPolicy
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.protocol.prefetch import map_news
from trimtab.roles.coordinator import migration
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members, MemberState
from trimtab.roles.coordinator.migration import Migration
from trimtab.roles.coordinator.outbox import Outbox, Send

log = logging.getLogger("trimtab.coordinator")


class Rebalancer:
    """Live placement and elastic servers. Not thread-safe: the coordinator's loop owns it.

    Args:
        members, maps: the job's members and map (shared with the coordinator).
        speeds: the servers' speed figures (fed by LOAD and the workers' reports).
        psld: the live placement policy, or None (the map then changes only by
            rotation, scaling and servers joining).
        scaling: decides when to ask for a server or give one back (with ``psld``).
        rotate_every: every this many steps, move every chunk to the next active server
            (a forced migration, for tests; 0 = never).
        synchronous: the consistency policy updates at step boundaries, where chunks
            can move; ``mode`` names it for the error when it does not.
        job_clock: the job's clock, for the logs.
    """

    def __init__(
        self,
        members: Members,
        maps: Maps,
        speeds: SpeedEstimator,
        psld: PsldController | None,
        scaling: ScalingPolicy,
        *,
        rotate_every: int,
        synchronous: bool,
        mode: str,
        job_clock: Callable[[], int],
    ) -> None:
        self.members = members
        self.maps = maps
        self.speeds = speeds
        self.psld = psld
        self.scaling = scaling
        self.rotate_every = rotate_every
        self.synchronous = synchronous
        self.mode = mode
        self.job_clock = job_clock
        #: The migration in flight (at most one).
        self.migrating: Migration | None = None
        self.migrations = 0
        self.bytes_moved = 0
        self._last = 0  # the clock of the last migration a policy started
        # With replicas: the owners a policy asked for, reached in role moves (a chunk
        # moves onto its backup), one migration after another.
        self._wanted: tuple[int, ...] | None = None
        #: While this says so, no migration starts at a step boundary (a checkpoint
        #: waits for its chunks where they are).
        self.paused: Callable[[], bool] = lambda: False
        #: While this says so (a failover in flight), no migration starts at all.
        self.failing: Callable[[], bool] = lambda: False
        self._held_once = 0  # chunks without a backup when last said (with replicas)
        self._abandoned: set[int] = set()  # epochs of migrations a failover replaced

    def step_boundary(self, clock: int, out: Outbox) -> None:
        """Every worker reported step ``clock - 1``: rotate, or ask PSLD for a new map
        and the scaling policy whether to grow or give a server back."""
        current = self.maps.map
        if (
            current is None
            or self.migrating is not None
            or self.maps.pending
            or clock <= self._last
            or self.paused()
            or self.failing()
        ):
            return
        owners = current.owners
        active = self.members.active_mask()
        n = len(self.members.servers)
        new: tuple[int, ...] | None = None
        speeds: list[float] | None = None
        if self.rotate_every and clock - self._last >= self.rotate_every:
            live = [s for s, a in enumerate(active) if a]
            new = tuple(live[(live.index(o) + 1) % len(live)] for o in owners)
        elif self.psld is not None:
            costs = chunk_costs(self.maps.sizes, self.members.num_workers)
            speeds = self.speeds.speeds(n)
            probe = frozenset(self.speeds.unknown(n))
            errors = self.speeds.errors(n)
            new = self.psld.decide(
                clock, costs, owners, speeds, active=active, probe=probe, errors=errors
            )
            self._maybe_grow(speeds, active)
            idle = self.scaling.idle_server(
                clock,
                owners,
                active,
                self.speeds.lasting(n),
                settled=not self.psld.trial_running,
            )
            if new is None and idle is not None:
                log.info(
                    "psld: server %d owns nothing and was found slow again each time it "
                    "was re-measured (%d times): it retires",
                    idle,
                    self.speeds.slow_rechecks(idle),
                )
                self.members.drain(self.members.servers[idle])
                self.members.target_servers = len(self.members.active_servers())
                self.membership_changed(out)
                return
        if new is None or new == owners:
            return
        self._last = clock
        if self.psld is not None and speeds is not None:
            self._log_plan(clock, speeds, owners, new)
        self.migrate(new, out)

    def _maybe_grow(self, speeds: Sequence[float] | None, active: Sequence[bool]) -> None:
        serving = len(self.members.active_servers())
        if (
            serving < self.members.max_servers
            and self.members.target_servers < serving + 1
            and self.scaling.wants_server(speeds, active)
        ):
            self.members.target_servers = serving + 1
            log.info("psld: a server straggles; asking for server %d", len(self.members.servers))

    def _log_plan(
        self, clock: int, speeds: Sequence[float], owners: Sequence[int], new: Sequence[int]
    ) -> None:
        n = len(self.members.servers)
        seen = [self.speeds.observed(s) for s in range(n)]
        bounds = [None if v is None else [round(x / 1e6, 1) for x in v] for v in seen]
        log.info(
            "psld at clock %d: speeds %s MB/s (workers saw between %s; errors %s), "
            "chunks per server %s -> %s",
            clock,
            [round(v / 1e6, 1) for v in speeds],
            bounds,
            [round(e, 3) for e in self.speeds.errors(n)],
            [owners.count(s) for s in range(n)],
            [new.count(s) for s in range(n)],
        )

    def scale(self, servers: int, out: Outbox) -> int:
        """Go to ``servers`` active servers (bounded by 1 and ``max_servers``): more are
        asked of the launcher (``wanted_servers`` in the status), fewer are drained
        (their chunks move away, then they are told to exit). Returns the target.
        Raises a BAD_STATE :class:`ProtocolError` unless the job is synchronous."""
        if not self.synchronous:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"scaling moves chunks at a synchronous step boundary; this job runs "
                f"--mode {self.mode}, so it cannot scale",
            )
        before = len(self.members.active_servers())
        target = self.members.scale_to(servers, self.speeds.speeds(len(self.members.servers)))
        if before > target:
            self.membership_changed(out)
        return target

    def membership_changed(self, out: Outbox) -> None:
        """A server joined or is draining: move chunks onto (off) it now; retried when
        the migration in flight finishes."""
        current = self.maps.map
        if current is None or self.migrating is not None or self.maps.pending or self.failing():
            return
        active = self.members.active_mask()
        if not any(active):
            return
        n = len(self.members.servers)
        speeds = self.speeds.speeds(n) or [1.0] * n
        costs = chunk_costs(self.maps.sizes, self.members.num_workers)
        plan = rebalance(costs, current.owners, speeds, active=active)
        if plan.owners != current.owners:
            self.migrate(plan.owners, out)
        elif self.unbacked():
            self.migrate(current.owners, out)  # the chunks held once get backups again
        if self.migrating is None:
            self.retire(out)

    def unbacked(self) -> list[int]:
        """The chunks held once in a job with replicas (none without): after failovers
        left them no live server but their owner's. Never blocks."""
        current = self.maps.map
        if not self.maps.replicas or current is None:
            return []
        live = [m.rank for m in self.members.servers if not m.finished]
        return replicas.unbacked(current.owners, self.maps.backups, live)

    def say_copies(self) -> None:
        """Say when the job starts running with fewer copies than asked (a warning, once
        for each failover that leaves chunks held once), and when every chunk has its
        backup again. Never blocks."""
        held_once = len(self.unbacked())
        if held_once and held_once != self._held_once:
            log.warning(
                "running with fewer copies than asked (--replicas %d): %d of %d chunks have "
                "no backup (live servers: %d); they get one as soon as a server joins (the "
                "launcher starts a replacement)",
                self.maps.replicas,
                held_once,
                len(self.maps.sizes),
                sum(not m.finished for m in self.members.servers),
            )
        elif not held_once and self._held_once:
            epoch = self.maps.map.epoch if self.maps.map is not None else 0
            log.warning(
                "replication restored: every chunk has a backup again (map epoch %d)", epoch
            )
        self._held_once = held_once

    def place(self) -> Outbox:
        """The first map, or the job's next table once every worker declared it
        (:meth:`Maps.place`); a table waits for the migration in flight. A new table
        changes the chunk count: a PSLD trial over the old chunks is dropped."""
        chunks = len(self.maps.sizes)
        out = self.maps.place(self.members, migrating=self.migrating is not None)
        if chunks and len(self.maps.sizes) != chunks and self.psld is not None:
            self.psld.chunks_changed()
        return out

    def migrate(self, owners: Sequence[int], out: Outbox) -> None:
        """Start moving chunks to ``owners`` (:func:`migration.start`). Raises
        :class:`UsageError` if no map exists, a migration is in flight, a table's
        chunks are being placed, or ``owners`` names a server that is not there."""
        if self.maps.pending:
            raise UsageError("a map is being placed on the servers: migrate once it is held")
        backups: list[int] = []
        current = self.maps.map
        if self.maps.replicas and current is not None and self.migrating is None:
            self._wanted = tuple(owners)
            active = [s for s, a in enumerate(self.members.active_mask()) if a]
            n = len(self.members.servers)
            speeds = self.speeds.speeds(n) if self.psld is not None else None
            owners, backups = replicas.role_moves(
                current.owners, self.maps.backups, owners, self.maps.sizes, active, speeds
            )
            if tuple(owners) == current.owners and backups == self.maps.backups:
                self._wanted = None
                return
        self.migrating, sends = migration.start(
            self.migrating, current, self.maps.header, owners, self.members.servers, backups
        )
        moving = [c for c, o in enumerate(owners) if current and o != current.owners[c]]
        old = self.maps.backups
        rebacked = sum(a != b for a, b in zip(backups, old, strict=False))
        log.info(
            "migration to epoch %d at step %d: %d chunks (%d bytes) move%s",
            self.migrating.epoch,
            self.job_clock(),
            len(moving),
            sum(self.maps.sizes[c] for c in moving),
            f" onto their backups, {rebacked} chunks get a new backup" if backups else "",
        )
        out += sends

    def on_ack(self, rank: int, header: Header, out: Outbox) -> None:
        """A server's MIGRATE_ACK; the last one publishes the map to the workers: the
        MAP_GETs waiting for it are answered, and every active worker is sent it
        (MAP_NEWS) to route its next step by, before any of that step's pushes would
        reach an old owner past its cut and come back *moved*."""
        if header.get("epoch") in self._abandoned:
            return  # (a server took a map a failover replaced: its ack is moot)
        current = self.maps.map
        if self.migrating is None and current is not None and header.get("epoch") == current.epoch:
            # The ack of the map that stands: a replacement coordinator rebuilt the job
            # from the servers' map while a role move's ack waited for its backups to
            # hold their chunks (sent once they do); nothing is left to complete.
            log.info("server %d acknowledged map epoch %d, which stands: moot", rank, current.epoch)
            return
        before = self.migrating
        self.migrating = after = migration.ack(before, rank, header)
        if before is not None and not before.acked and after.acked:
            addrs = [m.addr for m in self.members.servers]
            if after.backups:  # roles moved: what the new backups were sent is moved
                old = self.maps.backups
                self.bytes_moved += sum(
                    size
                    for size, a, b in zip(self.maps.sizes, after.backups, old, strict=False)
                    if a != b
                )
                self.maps.backups = list(after.backups)
            out += self.maps.publish(after.epoch, after.owners, addrs, after.cuts)
            self.members.placed(after.owners)
            if self.maps.published is not None:
                news = map_news(self.maps.published)
                workers = self.members.workers.values()
                out += [Send(w.peer, news) for w in workers if w.state is MemberState.ACTIVE]
        self._finish_if_done(out)

    def abandon(self) -> Migration | None:
        """Give up the migration in flight (a server died while it was taken: a
        failover replaces it), and the role moves planned after it; return it. Late
        acknowledgements of it are then ignored. Never blocks."""
        moving, self.migrating, self._wanted = self.migrating, None, None
        if moving is not None:
            self._abandoned.add(moving.epoch)
            log.warning("migration to epoch %d given up: a failover replaces it", moving.epoch)
        return moving

    def on_handed(self, header: Header, out: Outbox) -> None:
        """A server's HANDED: chunks reached their new owners."""
        self.migrating, moved = migration.handed(self.migrating, header, self.maps.sizes)
        self.bytes_moved += moved
        self._finish_if_done(out)

    def retire(self, out: Outbox) -> None:
        """Retire the drained servers no request can reach any more (see
        :meth:`Members.retire_empty`), never while a migration is in flight: its map is
        published once every server acknowledged it, before the chunks leaving a drained
        server are handed over, and a server told to exit then takes its chunks (and
        their HANDED) with it; the migration waits forever, and no later one starts.
        :meth:`_finish_if_done` retires them once it is done."""
        if self.migrating is not None:
            return
        if self.maps.map is not None:
            held = (*self.maps.map.owners, *self.maps.backups)  # a backup is held too
            out += self.members.retire_empty(held, self.maps.map.epoch)

    def _finish_if_done(self, out: Outbox) -> None:
        done = self.migrating
        if done is None or not done.done:
            return
        self.migrations += 1
        self.migrating = None
        log.info(
            "migration to epoch %d done at step %d (%d so far)",
            done.epoch,
            self.job_clock(),
            self.migrations,
        )
        self.say_copies()
        wanted, self._wanted = self._wanted, None
        current = self.maps.map
        if wanted is not None and current is not None and wanted != current.owners:
            active = self.members.active_mask()
            if not self.maps.pending and all(o < len(active) and active[o] for o in wanted):
                self.migrate(wanted, out)  # the next role move toward it
                if self.migrating is not None:
                    return
        self.retire(out)
        out += self.place()  # a table every worker declared meanwhile
        # A server draining, or one that joined during the migration (not yet given
        # anything), is handled now. A server the policy emptied on purpose is not
        # refilled here: that is the policy's to decide (or to retire it).
        if self.members.unsettled():
            self.membership_changed(out)
