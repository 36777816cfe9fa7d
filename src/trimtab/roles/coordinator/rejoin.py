"""A replacement coordinator's first phase: the job's members come back.

When a job's coordinator dies, its launcher starts another at the same address with
``rejoin`` set (:class:`~.config.CoordinatorConfig`), and the servers and workers, which
went on training meanwhile, reconnect and send REJOIN (:mod:`trimtab.protocol.rejoin`).
No state is copied from the dead coordinator: what it knew is rebuilt from what the
members hold:

- the servers hold the job map (tensors, tables, each chunk's owner and backup, the
  epoch) and the member key, which every credential was made from (sent masked by the
  server key);
- the workers hold their ranks and routing floors, and resend every request the dead
  coordinator left unanswered once REJOINED reaches them; their clocks come back with
  their next step reports.

Once every server the map names (as owner or backup) and every worker the launcher did
not see finish (``done``) is back, :meth:`Rejoins.rebuild` lays out the members and the
map, and each member gets REJOINED with the proof that the new coordinator holds the
secret it checked. A server that died with the coordinator (or meanwhile) never comes
back: once every worker is back and :data:`SERVER_GRACE_S` passed, the job is rebuilt
without it, the server laid out as a member not heard from, which the coordinator's
liveness then takes for lost (its chunks' backups own them, or the job ends naming the
chunks lost); if it rejoins before that, it takes its place. A map the servers
disagree on (the coordinator died as a migration or a failover was under way) cannot be
rebuilt: the job ends, saying to resume it.

Pure: no sockets, no threads; operations return the messages to send.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any

from trimtab.errors import JobAborted, ProtocolError
from trimtab.protocol import headers, rejoin
from trimtab.protocol.elastic import MAX_WORKERS
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.protocol.rejoin import RejoinHeader
from trimtab.roles.coordinator.config import CoordinatorConfig
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Member, Members, MemberState, Role
from trimtab.roles.coordinator.outbox import Outbox, Refuse, Send
from trimtab.runtime import credentials
from trimtab.transport.base import Peer

log = logging.getLogger("trimtab.coordinator")

#: Seconds after the replacement starts that it waits for every server the map names,
#: once every worker is back; then it goes on without those not back (see the module).
SERVER_GRACE_S = 5.0


class Rejoins:
    """The members that rejoined so far, until :meth:`ready`. Not thread-safe: the
    coordinator's loop owns it.

    Args:
        job: the job's id.
        server_key: the job's server key (empty: a job without one).
        num_workers: the job's workers.
        done: worker ranks whose processes ended (the launcher saw them exit 0): they
            said DONE to the dead coordinator and will not rejoin.
        wait_s: how long the members have to come back before the job ends.
    """

    def __init__(
        self, job: str, server_key: bytes, num_workers: int, done: Collection[int], wait_s: float
    ) -> None:
        self.job = job
        self._server_key = server_key
        self._ticket = credentials.join_ticket(server_key, job) if server_key else None
        self._num_workers = num_workers
        self.done = frozenset(done)
        self.started = time.monotonic()
        self.deadline = self.started + wait_s
        self.key: bytes | None = None
        self.servers: dict[int, tuple[Peer, RejoinHeader]] = {}
        # Each worker rank's REJOINs by peer: its proof is checked once the key is known
        # (a server brings it), and only a REJOIN with a valid proof takes the rank.
        self.workers: dict[int, dict[Peer, RejoinHeader]] = {}
        #: Whether the job was rebuilt: this phase is over.
        self.rebuilt = False

    @classmethod
    def of(cls, config: CoordinatorConfig) -> Rejoins:
        """The first phase of the coordinator ``config`` describes."""
        c = config
        return cls(c.job, c.server_key, c.num_workers, c.done_workers, c.rejoin_wait_s)

    def take(self, peer: Peer, header: Header, members: Members) -> Outbox:
        """A member's REJOIN; after :meth:`rebuild`, a late server's, which takes its
        place if the job still waits for it (its REJOINED is returned). Raises
        :class:`ProtocolError`: MALFORMED (see
        :func:`~trimtab.protocol.rejoin.read_rejoin`), FORBIDDEN for a server without
        the job's join ticket or with another member key than the others', BAD_STATE
        for a REJOIN the rebuilt job has no place for."""
        r = rejoin.read_rejoin(header)
        rank = r["rank"]
        if self.rebuilt:
            return self._late_server(peer, r, header, members)
        if r["role"] == Role.SERVER.value:
            credentials.admit_server(self._ticket, header, running=False)
            mask = credentials.key_mask(self._server_key, self.job, r["n"])
            key = credentials.masked(r["mk"], mask)
            if self.key is not None and key != self.key:
                raise credentials.forbidden(
                    f"server {rank}'s member key differs from the other servers': it is "
                    "not of this job, or its server key differs"
                )
            self.key = key
            self.servers[rank] = (peer, r)
        else:
            if rank >= MAX_WORKERS:
                raise ProtocolError(ErrorCode.BAD_STATE.value, f"worker rank {rank} is too big")
            self.workers.setdefault(rank, {})[peer] = r
        log.info("%s %d rejoined", r["role"], rank)
        return []

    def _late_server(self, peer: Peer, r: RejoinHeader, header: Header, members: Members) -> Outbox:
        """A server's REJOIN after the rebuild: it takes its place, if it is the one the
        job still waits for (not heard from since, not taken for lost)."""
        member = members.servers[r["rank"]] if r["role"] == "server" else None
        if member is None or member.state is MemberState.LOST or member.peer != _absent(r["rank"]):
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"{r['role']} {r['rank']} rejoined too late: the job went on without it",
            )
        credentials.admit_server(self._ticket, header, running=False)
        mask = credentials.key_mask(self._server_key, self.job, r["n"])
        if credentials.masked(r["mk"], mask) != self.key:
            raise credentials.forbidden(f"server {r['rank']}'s member key differs")
        del members.by_peer[member.peer]
        member.peer, member.addr, member.last_seen = peer, r["addr"], time.monotonic()
        members.by_peer[peer] = member
        log.warning("server %d rejoined the rebuilt job", member.rank)
        proof = credentials.rejoin_proof(self._server_key, self.job, "coordinator", r["n"])
        return [Send(peer, rejoin.rejoined(proof=proof))]

    def poll(self, members: Members, maps: Maps) -> Outbox:
        """Rebuild the job once it can be (:meth:`ready`). Raises :class:`JobAborted`
        once the members are late (:meth:`late`) or as :meth:`rebuild` does."""
        if self.rebuilt:
            return []
        why = self.late()
        if why is not None:
            raise JobAborted(why)
        if not self.ready():
            return []
        self.rebuilt = True
        return self.rebuild(members, maps)

    def ready(self) -> bool:
        """Whether every member is back, or every worker and a server are, and
        :data:`SERVER_GRACE_S` passed."""
        missing = self.missing()
        if not missing:
            return True
        graced = time.monotonic() - self.started >= SERVER_GRACE_S
        return graced and bool(self.servers) and all(m.startswith("server") for m in missing)

    def newest_map(self) -> dict[str, Any] | None:
        """The job map of the highest epoch among the servers back so far."""
        maps = [r["jm"] for _, r in self.servers.values()]
        return max(maps, key=lambda m: m.get("epoch", 0), default=None)

    def taking_part(self) -> list[int]:
        """The worker ranks taking part, as the servers count them (an elastic job's
        lost workers left out, its joined ones in), else every rank of the job."""
        job_map = self.newest_map()
        ranks = job_map.get("workers") if job_map is not None else None
        if isinstance(ranks, list) and ranks and all(type(r) is int for r in ranks):
            return sorted(ranks)
        return list(range(self._num_workers))

    def missing(self) -> list[str]:
        """Who is not back yet (``"server 1"``, ``"worker 0"``), or why none can be known
        (no server yet: the map names the servers)."""
        job_map = self.newest_map()
        if job_map is None or self.key is None:
            return ["every server"]
        named = {*job_map.get("owners", []), *(b for b in job_map.get("bk", []) if b >= 0)}
        lacking = [f"server {s}" for s in sorted(named) if s not in self.servers]
        expected = set(self.taking_part()) - self.done
        back = {w for w, peers in self.workers.items() if self._proven(w, peers)}
        return lacking + [f"worker {w}" for w in sorted(expected - back)]

    def _proven(self, rank: int, peers: dict[Peer, RejoinHeader]) -> bool:
        """Whether one of worker ``rank``'s REJOINs proves its credential."""
        assert self.key is not None
        token = credentials.credential(self.key, self.job, credentials.WORKER, rank)
        return any(
            credentials.proven(r["pf"], credentials.rejoin_proof(token, self.job, "worker", r["n"]))
            for r in peers.values()
        )

    def late(self) -> str | None:
        """Why the job ends, if the members did not all come back in time."""
        if time.monotonic() < self.deadline:
            return None
        return (
            "the coordinator died and its replacement waited in vain for "
            + ", ".join(self.missing())
            + " to rejoin; resume the job from its last checkpoint (--resume)"
        )

    def aborts(self, why: str) -> Outbox:
        """ABORT, saying ``why``, to every member that rejoined."""
        peers = {p for p, _ in self.servers.values()}
        peers.update(p for by_peer in self.workers.values() for p in by_peer)
        return [Send(p, headers.abort(why=why)) for p in peers]

    def adoptions(self) -> int:
        """The newest adoption any rejoined server's chunk took (0: none): the dead
        coordinator's count of adoptions, as far as the servers know it. Never blocks."""
        return max((r.get("ad", 0) for _, r in self.servers.values()), default=0)

    def rebuild(self, members: Members, maps: Maps) -> Outbox:
        """Lay out the members and the map from the REJOINs (call once
        :meth:`missing` is empty): members as they were, the servers the map names but
        that never came back as lost, the finished workers as done; then REJOINED to
        each member. A worker whose proof fails is refused (FORBIDDEN) and left out.
        Raises :class:`JobAborted` if the servers' maps differ or a migration was
        under way: the job cannot go on."""
        assert self.key is not None
        epochs = {r["jm"].get("epoch") for _, r in self.servers.values()}
        moving = sorted(rank for rank, (_, r) in self.servers.items() if r["mv"])
        if len(epochs) > 1 or moving:
            raise JobAborted(
                "the coordinator died while the placement changed (the servers hold maps "
                f"of epochs {sorted(e for e in epochs if e is not None)}"
                + (f", servers {moving} mid-migration" if moving else "")
                + "): its replacement cannot know which map stands; resume the job from "
                "its last checkpoint (--resume)"
            )
        job_map = headers.read_job_map(self.newest_map() or {})
        out: Outbox = []
        named = {*job_map["owners"], *(b for b in job_map.get("bk", []) if b >= 0)}
        for rank, addr in enumerate(job_map["servers"]):
            entry = self.servers.get(rank)
            if entry is None:  # lost before (LOST), or not back yet: heard from soon or lost
                state = MemberState.ACTIVE if rank in named else MemberState.LOST
                absent = Member(Role.SERVER, rank, _absent(rank), addr, state)
                members.servers.append(absent)
                if state is MemberState.ACTIVE:
                    members.by_peer[absent.peer] = absent
                    log.warning("server %d did not rejoin yet: lost unless it does", rank)
                continue
            peer, r = entry
            state = MemberState.ACTIVE if rank in named else MemberState.JOINED
            member = Member(Role.SERVER, rank, peer, r["addr"], state)
            members.servers.append(member)
            members.by_peer[peer] = member
            proof = credentials.rejoin_proof(self._server_key, self.job, "coordinator", r["n"])
            out.append(Send(peer, rejoin.rejoined(proof=proof)))
        members.target_servers = len(members.active_servers())
        taking = set(self.taking_part())
        for rank in sorted(taking | set(range(self._num_workers))):
            token = credentials.credential(self.key, self.job, credentials.WORKER, rank)
            # Not back: it ended (DONE), or an elastic job lost it before (LOST).
            gone = MemberState.DONE if rank in self.done or rank in taking else MemberState.LOST
            member = Member(Role.WORKER, rank, b"i:gone-%d" % rank, state=gone)
            for peer, r in self.workers.get(rank, {}).items():
                nonce = r["n"]
                if (
                    member.state is gone
                    and rank in taking
                    and credentials.proven(
                        r["pf"], credentials.rejoin_proof(token, self.job, "worker", nonce)
                    )
                ):
                    member = Member(Role.WORKER, rank, peer, floor=r.get("lo", 0))
                    members.by_peer[peer] = member
                    proof = credentials.rejoin_proof(token, self.job, "coordinator", nonce)
                    out.append(Send(peer, rejoin.rejoined(proof=proof)))
                else:
                    why = f"no proof of worker {rank}'s credential (or it rejoined already)"
                    out.append(Refuse(peer, 0, ErrorCode.FORBIDDEN.value, why))
            members.workers[rank] = member
        if taking != set(members.workers):  # an elastic job lost workers before
            members.part = sorted(taking)
        maps.rebuild(job_map, members)
        log.warning(
            "rebuilt the job from its members: %d servers, %d workers back, map epoch %d",
            len(self.servers),
            len(self.workers),
            maps.epoch,
        )
        return out


def _absent(rank: int) -> Peer:
    """The peer of server ``rank`` while it did not rejoin: a router identity no
    connection has, so that what is sent to it goes nowhere."""
    return b"i:absent-%d" % rank
