"""Elastic workers: a worker lost (its process died or fell silent) or joining a running
job, at a step boundary, with no rollback and no restart of the others.

Under ``bsp`` every worker reports each step at its end and waits for the answer (the
job's step boundary, :meth:`Elastic.report`): the answer carries every rank's share of
the next step's global batch (0 for a rank not taking part), so the workers change
together. A lost worker is dropped at once (:meth:`Elastic.lost`): the servers stop
waiting for it (WORKERS; each round in progress completes with the pushes that arrived,
weighted by their samples), and the boundary it held back completes over the others,
whose shares of the *same* global batch grow. A new worker (:meth:`Elastic.hold`) is
held at its DECLARE until the next boundary: the servers learn it first (WORKERS, and
every WORKERS_ACK awaited), then the others and it are answered together; it gets the
current values from the servers (the optimizer's pull of a table the job has) and its
share. Other consistency modes only drop a lost worker from the servers' and the
coordinator's bookkeeping.

Pure: operations return the messages to send. Not thread-safe: the coordinator's loop
owns it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, cast

from trimtab.policies.batching import BatchSizingPolicy, WorkerSample
from trimtab.protocol import elastic, headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.members import Member, Members, MemberState
from trimtab.roles.coordinator.outbox import Outbox, Refuse, Send
from trimtab.roles.coordinator.steps import Steps
from trimtab.transport.base import Peer

log = logging.getLogger("trimtab.coordinator")


@dataclasses.dataclass
class WorkerSet:
    """The batch-sizing state of a job: who takes part, the global batch, each rank's
    share of it. One object, so a checkpoint saves it whole (:meth:`to_dict`).

    Attributes:
        ranks: the workers taking part now, sorted.
        global_batch: samples per step over all workers (0 until the first step's
            reports say it); kept whatever the workers, so the learning-rate schedule
            holds.
        sizes: each rank's share of the next step.
        generation: rises with every change of ``ranks`` (WORKERS carries it).
        slots: ranks ever given (the length of a sizes vector).
    """

    ranks: list[int]
    global_batch: int = 0
    sizes: dict[int, int] = dataclasses.field(default_factory=dict)
    generation: int = 0
    slots: int = 0

    def vector(self) -> list[int]:
        """Every rank's share, by rank (0 for one not taking part). Pure."""
        return [self.sizes.get(r, 0) for r in range(max(self.slots, len(self.ranks)))]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (msgpack, JSON) of this state. Pure."""
        return {
            "ranks": list(self.ranks),
            "global_batch": self.global_batch,
            "sizes": {str(r): b for r, b in self.sizes.items()},
            "generation": self.generation,
            "slots": self.slots,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerSet:
        """The state :meth:`to_dict` gave. Raises ``KeyError``/``ValueError`` for a
        malformed dict."""
        return cls(
            ranks=sorted(int(r) for r in d["ranks"]),
            global_batch=int(d["global_batch"]),
            sizes={int(r): int(b) for r, b in d["sizes"].items()},
            generation=int(d["generation"]),
            slots=int(d["slots"]),
        )


#: A report waiting at a step boundary: (peer, request id, rank, batch).
_Waiting = tuple[Peer, int, int, int]


class Elastic:
    """The coordinator's part of elastic workers.

    Args:
        members, steps: the coordinator's.
        batching: splits the global batch among the ranks taking part.
        min_workers: below this many workers the job ends (:meth:`lost` says why).
        synchronous: the job runs ``bsp``: steps meet at the boundary and joins are
            possible; else a lost worker is only dropped from the bookkeeping.
        epoch: the published map's epoch now (report answers carry it).
        again: answers a worker's DECLARE of a table the job has (the coordinator's
            re-declaration path), given its clock of it by ``member.clocks``.
        ranks_changed: told the ranks taking part whenever they change (the job map a
            server joining later learns the workers from must say them).
    """

    def __init__(
        self,
        members: Members,
        steps: Steps,
        batching: BatchSizingPolicy,
        *,
        min_workers: int,
        synchronous: bool,
        epoch: Callable[[], int],
        again: Callable[[Member, Header], Outbox],
        ranks_changed: Callable[[list[int]], None] | None = None,
    ) -> None:
        self._members, self._steps, self._batching = members, steps, batching
        self.min_workers = min_workers
        self.synchronous = synchronous
        self._epoch, self._again = epoch, again
        self._ranks_changed = ranks_changed
        self.state = WorkerSet(ranks=list(range(members.num_workers)), slots=members.num_workers)
        members.part = list(self.state.ranks)  # a joiner takes part from its boundary on
        self._waiting: dict[int, list[_Waiting]] = {}
        self._joiners: list[tuple[Member, Header]] = []
        self._acks: set[int] = set()  # servers whose WORKERS_ACK a join awaits
        self._join_generation = 0  # ... of this generation or a later one
        self._held: Outbox = []  # what goes out once they acknowledged
        #: Workers lost so far, and joined.
        self.lost_count = 0
        self.joined_count = 0

    def lost(self, member: Member, why: str) -> tuple[Outbox, str | None]:
        """Worker ``member`` is gone (``why``): drop it at once. Returns the messages to
        send (WORKERS to the servers, the answers of a boundary it held back) and, if
        fewer than ``min_workers`` remain, why the job must end (then nothing else
        changed but its state)."""
        if member.state is not MemberState.LOST:
            member.move(MemberState.LOST)
        self.lost_count += 1
        m = self._members
        m.target_workers = min(m.target_workers, len(m.live_workers()))  # no replacement
        if member.rank not in self.state.ranks:  # joining, not yet taking part
            self._joiners = [(j, h) for j, h in self._joiners if j is not member]
            log.warning("worker %d lost (%s) before it took part", member.rank, why)
            return [], None
        self._steps.forget(member.rank)
        ranks = [r for r in self.state.ranks if r != member.rank]
        log.warning(
            "worker %d lost (%s); %d workers go on: %s", member.rank, why, len(ranks), ranks
        )
        if len(ranks) < max(1, self.min_workers):
            return [], (
                f"worker {member.rank} was lost ({why}) and {len(ranks)} workers remain, "
                f"below --min-workers {self.min_workers}; stopping the job"
            )
        out = self._set_ranks(ranks)
        for clock in sorted(self._waiting):
            out += self._boundary(clock)
        return out, None

    def rebuilt(self, ranks: list[int]) -> None:
        """A replacement coordinator rebuilt the job (:mod:`.rejoin`): ``ranks`` take
        part, as the servers count them (workers lost and joined before it included)."""
        self.state.ranks = sorted(ranks)
        self._members.part = list(self.state.ranks)
        self.state.slots = max(self.state.slots, max(ranks, default=-1) + 1)
        self._members.target_workers = len(ranks)

    def hold(self, member: Member, header: Header) -> Outbox:
        """A new worker's DECLARE (it joined the running job): answered at the next step
        boundary (:meth:`report`), once the servers know it. Returns nothing now."""
        log.info("worker %d joins: it starts at the next step boundary", member.rank)
        self._joiners.append((member, header))
        return []

    def refuse_held(self) -> Outbox:
        """Every worker taking part is done: the new workers still waiting for a step
        boundary get none. Their DECLAREs are refused, saying so. Never blocks."""
        joiners, self._joiners = self._joiners, []
        why = "the job ended before its next step boundary: there is no step left to join"
        return [Refuse(m.peer, h["i"], ErrorCode.BAD_STATE.value, why) for m, h in joiners]

    @property
    def held(self) -> list[int]:
        """The ranks of new workers waiting for the next step boundary."""
        return [m.rank for m, _ in self._joiners]

    def joining(self, member: Member) -> bool:
        """Whether ``member`` is a worker new to the running job, not yet taking part."""
        return member.rank not in self.state.ranks

    def report(self, member: Member, rid: int, clock: int, sample: WorkerSample) -> Outbox:
        """A worker's REPORT of step ``clock``: under ``bsp`` answered once every worker
        taking part reported it, with every rank's share of the next step; else at once."""
        if not self.synchronous:
            epoch = self._epoch()
            return [Send(member.peer, headers.report_reply(rid=rid, epoch=epoch, lead=None))]
        self._waiting.setdefault(clock, []).append((member.peer, rid, member.rank, sample.batch))
        return self._boundary(clock)

    def on_ack(self, server: int, header: Header) -> Outbox:
        """A server's WORKERS_ACK: once every live server acknowledged a join (or a
        later change: servers take WORKERS in order), the held answers go out."""
        if elastic.read_workers_ack(header)["g"] < self._join_generation:
            return []
        return self.server_lost(server)

    def server_lost(self, server: int) -> Outbox:
        """Server ``server`` acknowledged the join, or is gone: the join no longer
        waits for it."""
        if not self._acks:
            return []
        self._acks.discard(server)
        if self._acks:
            return []
        out, self._held = self._held, []
        for clock in sorted(self._waiting):  # a boundary that came meanwhile
            out += self._boundary(clock)
        return out

    # -- internals -------------------------------------------------------------------

    def _set_ranks(self, ranks: list[int]) -> Outbox:
        """The workers taking part are ``ranks``: tell every live server. Returns the
        WORKERS messages."""
        self.state.ranks = sorted(ranks)
        self._members.part = list(self.state.ranks)
        if self._ranks_changed is not None:
            self._ranks_changed(list(self.state.ranks))
        self.state.generation += 1
        self.state.sizes = {r: b for r, b in self.state.sizes.items() if r in ranks}
        g, ranks = self.state.generation, self.state.ranks
        servers = [m for m in self._members.servers if not m.finished]
        return [Send(m.peer, elastic.workers(generation=g, ranks=ranks)) for m in servers]

    def _boundary(self, clock: int) -> Outbox:
        """Answer step ``clock``'s reports if every worker taking part sent one (and no
        join waits for the servers): the next step's shares, joiners included."""
        waiting = self._waiting.get(clock, [])
        reported = {rank for _, _, rank, _ in waiting}
        if self._acks or not set(self.state.ranks) <= reported:
            return []
        del self._waiting[clock]
        mine = [w for w in waiting if w[2] in self.state.ranks]
        if not self.state.global_batch:
            self.state.global_batch = sum(b for _, _, _, b in mine)
        out: Outbox = []
        joiners, self._joiners = self._joiners, []
        if joiners:
            ranks = self.state.ranks + [m.rank for m, _ in joiners]
            for m, _ in joiners:
                self._steps.joined(m.rank, clock + 1)
                self.joined_count += 1
            out += self._set_ranks(ranks)
            # Nobody pushes for the next step before every server knows the joiners.
            self._acks = {m.rank for m in self._members.servers if not m.finished}
            self._join_generation = self.state.generation
        self.state.slots = max(self.state.slots, len(self._members.workers))
        history = self._steps.histories(self.state.ranks)
        self.state.sizes = self._batching.batch_sizes(history, self.state.global_batch)
        vector = self.state.vector()
        epoch = self._epoch()
        answers: Outbox = [
            Send(peer, headers.batch_sizes(rid=rid, sizes=vector, epoch=epoch))
            for peer, rid, _, _ in mine
        ]
        for m, header in joiners:
            for send in self._again(m, header):
                if isinstance(send, Send):
                    cast(dict[str, Any], send.header)["sizes"] = vector
                answers.append(send)
        if self._acks:
            self._held = answers  # once every server knows the joiners
            return out
        return out + answers
