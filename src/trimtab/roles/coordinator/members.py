"""The job's members: who registered, in which state, each worker's routing floor, and
which servers the job wants, drains and retires. Pure: no sockets, no threads."""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Sequence

from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.transport.base import Peer

log = logging.getLogger("trimtab.coordinator")


class Role(str, enum.Enum):
    SERVER = "server"
    WORKER = "worker"


class MemberState(enum.Enum):
    """Where a member is in its life. The legal transitions::

        server:  JOINED -> ACTIVE        given chunks (the first map, or a migration)
                 JOINED -> DRAINING      drained before it was given anything
                 ACTIVE -> DRAINING      scaled in: its chunks move away
                 DRAINING -> EMPTY       it owns nothing as of map ``empty_at``
                 EMPTY -> RETIRED        every worker's routing floor passed ``empty_at``:
                                         told to exit
                 JOINED, ACTIVE, DRAINING, EMPTY -> LOST
                                         it died (:meth:`Coordinator.member_lost`): its
                                         chunks' backups own them (``--replicas``)
        worker:  ACTIVE -> LEFT          it called shutdown() (LEAVE): out of the job for
                                         now, its rank kept, still heartbeating
                 LEFT -> ACTIVE          it registered again under its rank (init()
                                         after shutdown())
                 ACTIVE -> DONE          its process ended (DONE) without shutdown()
                 LEFT -> DONE            its process ended after shutdown()
                 DONE -> ACTIVE          a worker's new connection registered again
                                         under its rank, while the job still runs
                 ACTIVE -> LOST          it died or fell silent in an elastic job: the
                 LEFT -> LOST            others go on without it (:mod:`.elastic`)

    A server is *active* (placement may give it chunks) while JOINED or ACTIVE; a
    member is *finished* (no longer watched for silence) once RETIRED, DONE or LOST. A
    LEFT worker is watched (its process keeps a connection open): if it dies, the job
    ends (or, elastic, goes on without it); the job ends normally once every worker is
    DONE or LOST. A LOST server's chunks went to their backups (``--replicas``).
    """

    JOINED = "joined"
    ACTIVE = "active"
    DRAINING = "draining"
    EMPTY = "empty"
    RETIRED = "retired"
    LOST = "lost"
    LEFT = "left"
    DONE = "done"


_MOVES: dict[tuple[Role, MemberState], frozenset[MemberState]] = {
    (Role.SERVER, MemberState.JOINED): frozenset(
        {MemberState.ACTIVE, MemberState.DRAINING, MemberState.LOST}
    ),
    (Role.SERVER, MemberState.ACTIVE): frozenset({MemberState.DRAINING, MemberState.LOST}),
    (Role.SERVER, MemberState.DRAINING): frozenset({MemberState.EMPTY, MemberState.LOST}),
    (Role.SERVER, MemberState.EMPTY): frozenset({MemberState.RETIRED, MemberState.LOST}),
    (Role.WORKER, MemberState.ACTIVE): frozenset(
        {MemberState.LEFT, MemberState.DONE, MemberState.LOST}
    ),
    (Role.WORKER, MemberState.LEFT): frozenset(
        {MemberState.ACTIVE, MemberState.DONE, MemberState.LOST}
    ),
    (Role.WORKER, MemberState.DONE): frozenset({MemberState.ACTIVE}),
}


@dataclasses.dataclass
class Member:
    """One registered node. Loop thread only."""

    role: Role
    rank: int
    peer: Peer
    addr: str = ""
    state: MemberState = MemberState.ACTIVE
    last_seen: float = dataclasses.field(default_factory=time.monotonic)
    # The map epoch from which an EMPTY server owns nothing.
    empty_at: int = 0
    # A worker's routing floor: the oldest map by which it may still have a data request
    # in flight (the ``lo`` of its MAP_GETs, REPORTs and heartbeats; the first map until
    # it says).
    floor: int = 0
    # A worker's clock of each table (its n-th optimizer), as it said when it left
    # (LEAVE): where its optimizers go on after init() again.
    clocks: list[int] = dataclasses.field(default_factory=list)

    def move(self, to: MemberState) -> None:
        """Go to state ``to``. Raises a BAD_STATE :class:`ProtocolError` for a move the
        :class:`MemberState` docstring does not list."""
        if to not in _MOVES.get((self.role, self.state), frozenset()):
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"{self.role.value} {self.rank} cannot go from {self.state.value} to {to.value}",
            )
        self.state = to

    @property
    def active(self) -> bool:
        """A server placement may give chunks to (JOINED or ACTIVE)."""
        return self.state in (MemberState.JOINED, MemberState.ACTIVE)

    @property
    def finished(self) -> bool:
        """Retired, done or lost: its silence is expected."""
        return self.state in (MemberState.RETIRED, MemberState.DONE, MemberState.LOST)


class Members:
    """Every member of one job, by peer, server index and worker rank, and the number of
    active servers the job aims for. Not thread-safe: the coordinator's loop owns it.

    Args:
        num_workers: the job's workers (ranks ``0..num_workers-1``).
        num_servers: servers the job starts with (and the first target).
        max_servers: active servers the job may grow to.
    """

    def __init__(self, num_workers: int, num_servers: int, max_servers: int) -> None:
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.max_servers = max_servers
        self.by_peer: dict[Peer, Member] = {}
        self.servers: list[Member] = []
        self.workers: dict[int, Member] = {}
        #: Active servers wanted: more than there are asks the launcher for some.
        self.target_servers = num_servers
        #: Live workers wanted, and the most a running job may have (joins: a rank
        #: beyond the first ``num_workers``); an elastic job raises ``max_workers``.
        self.target_workers = num_workers
        self.max_workers = num_workers
        #: Whether workers may join the running job at all (an elastic job).
        self.joins = False
        #: The ranks taking part, where an elastic job changed them (else every one).
        self.part: list[int] | None = None

    def register(self, peer: Peer, header: Header, *, running: bool) -> Member:
        """Add the node that sent REGISTER ``header`` (``role``, ``rank``, ``addr``).
        ``running``: the job is placed already, so a server may join up to
        :meth:`wanted_servers`. A worker naming the rank of one that left (LEAVE:
        ``init()`` after ``shutdown()``) or said DONE takes its place again, with its
        routing floor and clocks: the job ends only once every worker is done, so this
        works while another still runs. Raises :class:`ProtocolError` (BAD_STATE:
        registered already, no rank or server slot free, the rank held by an active
        worker; MALFORMED: no or an unknown role, a server without an address)."""
        request = headers.read_register(header)
        role = request["role"]
        if peer in self.by_peer:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "this node is already registered")
        if role == Role.SERVER.value:
            limit = self.wanted_servers() if running else self.num_servers
            if len(self.servers) >= limit:
                grow = self.max_servers > limit
                raise ProtocolError(
                    ErrorCode.BAD_STATE.value,
                    f"the job already has its {limit} servers"
                    + (f" (it may grow to {self.max_servers} when asked)" if grow else ""),
                )
            member = Member(
                Role.SERVER, len(self.servers), peer, request["addr"], MemberState.JOINED
            )
            self.servers.append(member)
        elif role == Role.WORKER.value:
            rank = request.get("rank", -1)
            if not isinstance(rank, int) or rank < 0:
                rank = min(set(range(self.num_workers)) - set(self.workers), default=-1)
            if running and (rank < 0 or rank >= self.num_workers) and self.may_join():
                rank = len(self.workers)  # a new worker joins the running job
            elif rank >= self.num_workers or rank < 0:
                raise ProtocolError(
                    ErrorCode.BAD_STATE.value,
                    f"no worker rank free (the job has {self.num_workers}; workers join a "
                    "running job started with --max-workers K, under --mode bsp)",
                )
            left = self.workers.get(rank)
            if left is not None and left.state not in (MemberState.LEFT, MemberState.DONE):
                raise ProtocolError(ErrorCode.BAD_STATE.value, f"worker rank {rank} is taken")
            member = Member(Role.WORKER, rank, peer)
            if left is not None:
                was = left.state.value
                left.move(MemberState.ACTIVE)  # (checks the move; the new member takes over)
                del self.by_peer[left.peer]
                member.floor, member.clocks = left.floor, left.clocks
                log.info("worker %d registers again (it was %s)", rank, was)
            self.workers[rank] = member
        else:
            raise ProtocolError(ErrorCode.MALFORMED.value, f"unknown role {role!r}")
        self.by_peer[peer] = member
        log.info("%s %d joined", member.role.value, member.rank)
        return member

    # -- servers -------------------------------------------------------------------

    def active_servers(self) -> list[Member]:
        """Servers placement may give chunks to, by index."""
        return [m for m in self.servers if m.active]

    def active_mask(self) -> list[bool]:
        """Per server index: whether it is active."""
        return [m.active for m in self.servers]

    def wanted_servers(self) -> int:
        """How many server processes the job wants started (the launcher polls it):
        those registered plus those the target still lacks."""
        lacking = max(0, self.target_servers - len(self.active_servers()))
        return len(self.servers) + lacking

    def placed(self, owners: Sequence[int]) -> None:
        """The servers in ``owners`` were given chunks: JOINED ones become ACTIVE."""
        for rank in set(owners):
            if self.servers[rank].state is MemberState.JOINED:
                self.servers[rank].move(MemberState.ACTIVE)

    def unsettled(self) -> bool:
        """Whether a server drains (or waits to retire), or joined and was given nothing
        yet: the map may have to change for it. A server the policy emptied on purpose
        is ACTIVE and does not count: refilling it is the policy's call."""
        unsettled = (MemberState.JOINED, MemberState.DRAINING, MemberState.EMPTY)
        return any(m.state in unsettled for m in self.servers)

    def drain(self, member: Member) -> None:
        """Start moving ``member``'s chunks away; it retires once it owns nothing."""
        member.move(MemberState.DRAINING)
        log.info("server %d drains: its chunks move away, then it exits", member.rank)

    def scale_to(self, target: int, speeds: Sequence[float] | None) -> int:
        """Aim for ``target`` active servers, bounded by 1 and ``max_servers``; drain the
        slowest measured beyond it (unmeasured ones count as fast). Returns the target."""
        target = min(max(1, target), self.max_servers)
        self.target_servers = target
        active = self.active_servers()
        if len(active) > target:
            known = speeds or [1.0] * len(self.servers)
            active.sort(key=lambda m: -known[m.rank])
            for m in active[target:]:
                self.drain(m)
        return target

    def retire_empty(self, owners: Sequence[int], epoch: int) -> Outbox:
        """Retire draining servers that own nothing under map ``epoch`` (``owners``),
        once no worker has a request in flight that an older map routed (each worker's
        floor): until then such a request may still reach them, and they answer it
        *moved*. Having sent a worker the newer map is not enough: requests it sent by
        the old one may not have been read yet, and a server stopped before reading them
        leaves their sender waiting forever. Returns their SHUTDOWNs."""
        owned = set(owners)
        # A LEFT worker has no request in flight (it drained before it left), and learns
        # the current map when it declares again.
        known = min(
            (w.floor for w in self.workers.values() if w.state is MemberState.ACTIVE),
            default=epoch,
        )
        out: Outbox = []
        for m in self.servers:
            if m.state is MemberState.DRAINING and m.rank not in owned:
                m.move(MemberState.EMPTY)
                m.empty_at = epoch
            if m.state is MemberState.EMPTY and m.rank not in owned and known >= m.empty_at:
                log.info("server %d owns nothing now: it retires", m.rank)
                m.move(MemberState.RETIRED)
                out.append(Send(m.peer, headers.shutdown()))
        return out

    # -- workers -------------------------------------------------------------------

    def raise_floor(self, member: Member, floor: int) -> bool:
        """Take a worker's routing floor; True if it rose (draining servers may retire)."""
        if member.role is not Role.WORKER or floor <= member.floor:
            return False
        member.floor = floor
        return True

    def worker_left(self, member: Member, clocks: list[int]) -> None:
        """``member`` called ``shutdown()`` (LEAVE), its optimizers at ``clocks`` (by
        table): it keeps its rank and may register again; a repeated LEAVE only updates
        the clocks. Raises a BAD_STATE :class:`ProtocolError` from a server or a worker
        that said DONE."""
        if member.role is not Role.WORKER:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "only workers leave the job")
        if member.state is not MemberState.LEFT:
            member.move(MemberState.LEFT)
        member.clocks = list(clocks)
        log.info("worker %d left the job for now (clocks %s)", member.rank, clocks)

    def worker_done(self, member: Member) -> bool:
        """``member``'s process ended (DONE; a repeated DONE changes nothing). Returns
        True once every worker of the job is done."""
        if member.state is not MemberState.DONE:
            member.move(MemberState.DONE)
        return len(self.workers) >= self.num_workers and all(
            m.state in (MemberState.DONE, MemberState.LOST) for m in self.workers.values()
        )

    def taking_part(self) -> list[int]:
        """The ranks whose pushes the servers wait for, sorted."""
        return sorted(self.workers if self.part is None else self.part)

    def live_workers(self) -> list[Member]:
        """Workers neither done nor lost, by rank."""
        return [m for _, m in sorted(self.workers.items()) if not m.finished]

    def may_join(self) -> bool:
        """Whether a new worker may join the running job now (an elastic job with fewer
        live workers than ``max_workers``: one the launcher started for ``trimtab scale
        --workers``, or one started by hand, maybe in a lost one's place)."""
        return self.joins and len(self.live_workers()) < self.max_workers

    def wanted_workers(self) -> int:
        """How many worker processes the job wants started in all (the launcher polls
        it): those registered plus those the target still lacks. A worker that is done
        finished its work (it is not lacking); only a job that takes joins wants more."""
        if not self.joins:
            return len(self.workers)
        staying = [m for m in self.workers.values() if m.state is not MemberState.LOST]
        lacking = max(0, min(self.target_workers, self.max_workers) - len(staying))
        return len(self.workers) + lacking

    def shutdown(self) -> Outbox:
        """SHUTDOWN for every server not retired or lost: the job ended."""
        return [Send(m.peer, headers.shutdown()) for m in self.servers if not m.finished]

    def silent(self, now: float, dead_after_s: float) -> Member | None:
        """A member not finished and silent for more than ``dead_after_s``, or None."""
        for m in self.by_peer.values():
            if not m.finished and now - m.last_seen > dead_after_s:
                return m
        return None

    def describe(self, owned: Callable[[int], int]) -> list[str]:
        """One line per server: address, state, chunks owned (``owned(rank)``)."""
        return [
            f"  server {m.rank} at {m.addr}: {m.state.value}, owns {owned(m.rank)} chunks"
            for m in self.servers
        ]
