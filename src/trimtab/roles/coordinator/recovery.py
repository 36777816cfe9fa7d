"""A member lost: what the coordinator does when a server or a worker dies. Pure: each
operation returns the messages to send (and why the job must end, if it must).

- A worker lost ends the job (elastic workers are not built yet).
- A server lost, in a job without replicas, ends the job with a message naming the
  chunks that died with it.
- A server lost while a migration moves roles: the migration is given up, every live
  server says what it holds and as of which round (HOLDINGS, HELD: a server keeps the
  copies a map took from it until the next map), and each chunk goes to its newest
  copy under the failover map (then as below). Unanswered pushes are resent to the new
  owners and applied once (a round a promoted copy holds is answered, not applied).
- A server lost, in a job with replicas (``--replicas 1``), is a *failover*: its
  chunks go to their backups and every chunk left without a backup gets a new one
  (:func:`trimtab.policies.replicas.failover`) under a new map epoch. Every live server
  gets FAILOVER (the new owners and backups) and answers FAILOVER_ACK; every worker gets
  FAILOVER (the dead server's address, the new epoch), fails what the dead server left
  unanswered as *moved*, and asks for the map of that epoch, which is published once
  every live server acknowledged: the workers resend to the new owners only then, so
  a promoted backup already holds the chunk. The epoch fences the dead server off: a
  backup refuses its writes (STALE_EPOCH) if it was only slow.
"""

from __future__ import annotations

import dataclasses
import logging

from trimtab.errors import ProtocolError
from trimtab.policies import replicas
from trimtab.protocol import replica
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.liveness import lost_message
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Member, Members, MemberState, Role
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.roles.coordinator.rebalance import Rebalancer

log = logging.getLogger("trimtab.coordinator")


@dataclasses.dataclass
class _Asking:
    """A death during a migration: the failover map's ``epoch``, the ``dead`` server,
    the live servers yet to say what they hold (HELD), what each said (chunk ->
    rounds applied), and the owners the migration given up meant (``meant``)."""

    epoch: int
    dead: Member
    waiting: set[int]
    rounds: dict[int, dict[int, int]]
    meant: tuple[int, ...]


@dataclasses.dataclass
class Failover:
    """A failover in flight: its map (``epoch``, ``owners``) and the live servers yet to
    acknowledge it."""

    epoch: int
    owners: tuple[int, ...]
    acks: set[int]


class Recovery:
    """The coordinator's answer to a lost member. Not thread-safe: the coordinator's
    loop owns it.

    Args:
        members: the job's members.
        maps: the placement map (its backup table is set up here: ``maps.replicas``).
        replicas: backups per chunk (0 or 1).
        rebalancer: live placement, whose migration in flight a failover cannot join.
    """

    def __init__(
        self, members: Members, maps: Maps, replicas: int, rebalancer: Rebalancer | None = None
    ) -> None:
        self._members = members
        self._maps = maps
        self._rebalancer = rebalancer
        self.replicas = replicas
        maps.replicas = replicas
        if rebalancer is not None:
            rebalancer.failing = lambda: self.failing is not None or self.asking is not None
        #: The failover in flight, if any, and a death during a migration whose live
        #: servers are still saying what they hold (before its failover).
        self.failing: Failover | None = None
        self.asking: _Asking | None = None
        #: Failovers completed (published).
        self.failovers = 0

    def member_lost(self, member: Member, why: str, out: Outbox) -> str | None:
        """``member`` died (``why``: how it was noticed, e.g. "has been silent for
        3s"). Appends to ``out`` what must be sent; returns why the job must end, or
        None if it goes on (a failover started). A member lost twice, or one that had
        finished, changes nothing."""
        if member.finished:
            return None
        who = f"{member.role.value} {member.rank}"
        if member.role is Role.WORKER:
            return f"{who} {why}; stopping the job"
        current = self._maps.map
        if current is None:
            return f"{who} {why} before the job was placed; stopping the job"
        owned = [c for c, o in enumerate(current.owners) if o == member.rank]
        if not self.replicas:
            return (
                lost_message(member, why, current) + ". They had no replica and are lost: "
                "run with --replicas 1 to survive a server's death."
            )
        pending = self.failing or self.asking
        if pending is not None:
            return f"{who} {why} during the failover to map {pending.epoch}; stopping the job"
        live = [m.rank for m in self._members.servers if not m.finished and m is not member]
        moving = self._rebalancer.abandon() if self._rebalancer is not None else None
        if moving is not None:
            # Chunks were changing hands (roles: a chunk onto its backup, or a new
            # backup being filled): which copy of each is newest is not known here.
            # Every live server says what it holds, and as of which round (HOLDINGS).
            member.move(MemberState.LOST)
            epoch = max(self._maps.epoch, moving.epoch) + 1
            self.asking = _Asking(epoch, member, set(live), {}, moving.owners)
            log.error(
                "%s %s while chunks moved to map %d: asking the %d live servers which "
                "copies they hold (failover map %d)",
                who,
                why,
                moving.epoch,
                len(live),
                epoch,
            )
            if not live:
                return f"{who} {why}: no server is left; stopping the job"
            query = replica.holdings(epoch=epoch)
            out += [Send(self._members.servers[r].peer, query) for r in live]
            return None
        owners, backups, lost = replicas.failover(
            current.owners, self._maps.backups, self._maps.sizes, member.rank, live
        )
        if lost:
            return (
                f"{who} {why}; chunks {_ranges(lost)} lost their owner and backup at "
                "once; stopping the job"
            )
        member.move(MemberState.LOST)
        log.error(
            "%s %s: its %d chunks go to their backups under map epoch %d",
            who,
            why,
            len(owned),
            self._maps.epoch + 1,
        )
        self._fail_over(member, self._maps.epoch + 1, owners, backups, live, out)
        return None

    def on_held(self, member: Member, header: Header, out: Outbox) -> str | None:
        """A server's HELD: once every live server said what it holds, each of the dead
        server's chunks (every chunk: the map was changing) goes to the live server
        holding its newest copy (the most rounds applied; ties: the owner the migration
        meant, then the one before), and the failover proceeds as for any death.
        Returns why the job must end (a chunk no live server holds), else None. Raises
        MALFORMED or BAD_STATE :class:`ProtocolError` for a bad or unasked HELD."""
        epoch, rounds = replica.read_held(header, len(self._maps.sizes))
        asking = self.asking
        if asking is None or epoch != asking.epoch or member.rank not in asking.waiting:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"no HOLDINGS of map {epoch} asked")
        asking.waiting.discard(member.rank)
        asking.rounds[member.rank] = rounds
        if asking.waiting:
            return None
        self.asking = None
        current = self._maps.map
        before = current.owners if current is not None else asking.meant
        owners: list[int] = []
        lost: list[int] = []
        for cid in range(len(self._maps.sizes)):
            holders = {s: r[cid] for s, r in asking.rounds.items() if cid in r}
            if not holders:
                lost.append(cid)
                owners.append(asking.meant[cid])
                continue
            newest = max(holders.values())
            preferred = [asking.meant[cid], before[cid], *sorted(holders)]
            owners.append(next(s for s in preferred if holders.get(s) == newest))
        dead = asking.dead
        if lost:
            return (
                f"server {dead.rank} died while chunks moved, and no live server holds "
                f"chunks {_ranges(lost)}; stopping the job"
            )
        live = sorted(asking.rounds)
        backups = replicas.backups(owners, self._maps.sizes, live, keep=self._maps.backups)
        moved = sum(a != b for a, b in zip(owners, before, strict=False))
        log.error(
            "server %d's chunks, and every chunk on the move, go to the newest copies "
            "under map epoch %d (%d chunks change owner)",
            dead.rank,
            asking.epoch,
            moved,
        )
        self._fail_over(dead, asking.epoch, owners, backups, live, out)
        return None

    def _fail_over(
        self,
        dead: Member,
        epoch: int,
        owners: list[int],
        backups: list[int],
        live: list[int],
        out: Outbox,
    ) -> None:
        """Send the failover map ``epoch`` (``owners``, ``backups``) to the ``live``
        servers and the notice of ``dead`` to the workers; it is published once every
        live server acknowledged it."""
        self._maps.backups = backups
        self.failing = Failover(epoch, tuple(owners), set(live))
        servers = [m.addr for m in self._members.servers]
        failover = replica.failover(
            epoch=epoch, dead=dead.rank, owners=owners, backups=backups, servers=servers
        )
        # With the job's tables: a server that joined and was not yet given the job (the
        # launcher's replacement for a lost one) may be a new backup now.
        job: Header = dict(self._maps.header or {})
        to_servers: Header = {**job, **failover, "epoch": epoch}
        out += [Send(self._members.servers[r].peer, to_servers) for r in live]
        notice = replica.failover_notice(epoch=epoch, dead=dead.addr)
        out += [Send(w.peer, notice) for w in self._members.workers.values() if not w.finished]
        if not live:
            out += self._publish()

    def on_ack(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        """A server's FAILOVER_ACK: once every live server took the failover map, it is
        published (the workers' MAP_GETs for it are answered). Raises a BAD_STATE
        :class:`ProtocolError` if no failover to its epoch is in flight."""
        epoch = replica.read_failover_ack(header)["e"]
        failing = self.failing
        if failing is None or failing.epoch != epoch:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"no failover to map {epoch} in flight")
        failing.acks.discard(member.rank)
        if not failing.acks:
            out += self._publish()

    def _publish(self) -> Outbox:
        failing = self.failing
        assert failing is not None
        self.failing = None
        self.failovers += 1
        current = self._maps.map
        servers = current.servers if current else ()
        log.info("failover map epoch %d published", failing.epoch)
        out = self._maps.publish(failing.epoch, failing.owners, servers, {})
        if self._rebalancer is not None:
            self._rebalancer.say_copies()
            # A server that joined meanwhile (a replacement) takes chunks, or backs up
            # those held once now.
            if self._members.unsettled() or self._rebalancer.unbacked():
                self._rebalancer.membership_changed(out)
        return out


def _ranges(chunks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[str] = []
    for c in sorted(chunks):
        if spans and int(spans[-1].split("-")[-1]) == c - 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{c}"
        else:
            spans.append(str(c))
    return ", ".join(spans) or "none"
