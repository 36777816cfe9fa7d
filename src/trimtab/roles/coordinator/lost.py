"""The coordinator's handling of members lost and workers joining, as a part of
:class:`~trimtab.roles.coordinator.node.Coordinator` (a mixin: the loop's module stays
short). :meth:`MemberLoss.member_lost` is the single entry point for a lost member,
whatever noticed it (today the heartbeat silence); the worker case goes to
:mod:`.elastic` in an elastic job, the server case to :mod:`.recovery` (a failover
under ``--replicas``), anything else ends the job.
"""

from __future__ import annotations

import logging
from typing import Any

from trimtab.errors import JobAborted, ProtocolError
from trimtab.policies.batching import BatchSizingPolicy, WorkerSample
from trimtab.protocol import elastic, headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.checkpoint import Checkpoints
from trimtab.roles.coordinator.collectives import Collectives
from trimtab.roles.coordinator.config import CoordinatorConfig
from trimtab.roles.coordinator.elastic import Elastic
from trimtab.roles.coordinator.liveness import lost_message
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Member, Members, Role
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.roles.coordinator.recovery import Recovery
from trimtab.roles.coordinator.rejoin import Rejoins
from trimtab.roles.coordinator.steps import Steps
from trimtab.transport import Peer

log = logging.getLogger("trimtab.coordinator")


class MemberLoss:
    """Lost members and joining workers, for the coordinator's loop (loop thread only).
    The attributes are the coordinator's."""

    config: CoordinatorConfig
    _members: Members
    _steps: Steps
    _maps: Maps
    _collectives: Collectives
    _elastic: Elastic | None
    _recovery: Recovery
    checkpoints: Checkpoints
    _abort: str | None
    _stop: bool
    _rejoins: Rejoins | None
    _key: bytes

    def abort(self, why: str) -> None:
        raise NotImplementedError  # the coordinator's

    def _send(self, out: Outbox) -> None:
        raise NotImplementedError  # the coordinator's

    # -- a replacement coordinator's first phase (:mod:`.rejoin`) ---------------------

    def _on_rejoin(self, peer: Peer, header: Header, out: Outbox) -> None:
        if self._rejoins is None:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "no coordinator died here: REGISTER")
        out += self._rejoins.take(peer, header, self._members)
        self._rejoin_poll(out)

    def _rejoin_poll(self, out: Outbox) -> Outbox:
        """The job rebuilt from its members once it can be (:meth:`Rejoins.poll`); or
        ended, they told why. Returns ``out``, added to."""
        assert self._rejoins is not None
        try:
            out += self._rejoins.poll(self._members, self._maps)
            if self._rejoins.rebuilt and self._rejoins.key is not None:
                self._key = self._rejoins.key  # the job's: every credential is made from it
                # Adoptions go on from the newest a server's chunk took: a number the dead
                # coordinator granted already would be refused as a replay.
                self._collectives.adoptions = max(
                    self._collectives.adoptions, self._rejoins.adoptions()
                )
                if self._elastic is not None:  # its workers as the servers count them
                    self._elastic.rebuilt(self._rejoins.taking_part())
        except JobAborted as exc:
            out += self._rejoins.aborts(str(exc))
            self.abort(str(exc))
        return out

    def _make_elastic(self, batching: BatchSizingPolicy, synchronous: bool) -> Elastic | None:
        """The elastic part of a job whose settings allow losing or adding workers, else
        None (a lost worker ends the job)."""
        c = self.config
        if not c.settings().elastic_workers:
            return None
        self._members.joins = synchronous
        self._members.max_workers = c.max_workers or c.num_workers
        return Elastic(
            self._members,
            self._steps,
            batching,
            min_workers=c.min_workers or c.num_workers,
            synchronous=synchronous,
            epoch=lambda: self._maps.published_epoch,
            again=self._declare_again,
            ranks_changed=self._maps.take_part,
        )

    def _declare_again(self, member: Member, header: Header) -> Outbox:
        return self._maps.again(
            member, header, self._members, lambda _: self._steps.clocks.get(member.rank, 0)
        )

    def member_lost(self, member: Member, why: str) -> None:
        """``member`` is gone (``why``: "has been silent for 31s", "closed its
        connection"). A worker of an elastic job is dropped and the job goes on while
        ``min_workers`` remain; anything else ends the job. A finished member is
        ignored. Never blocks; loop thread only."""
        if member.finished or self._abort is not None:
            return
        if member.role is Role.SERVER:
            # Its backups take over (:mod:`.recovery`), or the job ends naming the
            # chunks lost and the checkpoint to resume from.
            out: Outbox = []
            try:
                abort = self._recovery.member_lost(member, why, out)
            finally:
                self._send(out)
            if abort is not None:
                last = self.checkpoints.last_checkpoint
                # Advice to resume only where a checkpoint exists.
                resume = (
                    f". The newest checkpoint: trimtab run --resume {last} ..."
                    if last
                    else ". No checkpoint was taken (--checkpoint-every K takes them)"
                )
                self._end(abort.rstrip(".") + resume)
            return
        if self._elastic is None:  # a worker of a job that is not elastic ends it
            self._end(lost_message(member, why, self._maps.map))
            return
        out, fatal = self._elastic.lost(member, why)
        out += self.elastic_changed()
        # If it lives after all (silent, not dead), it must not push again.
        out.append(Send(member.peer, headers.abort(why=f"worker {member.rank} was dropped")))
        out += self._collectives.left(member.rank)
        if fatal is None and all(m.finished for m in self._members.workers.values()):
            log.info("every worker is done or lost; shutting the job down")
            out += self._members.shutdown()
            self._stop = True
        self._send(out)
        if fatal is not None:
            self._end(fatal)

    def _end(self, why: str) -> None:
        """End the job for ``why`` (the loop sends every member ABORT as it ends)."""
        self._abort = why
        log.error(why)

    def _answer_report(
        self, member: Member, rid: int, clock: int, sample: WorkerSample, epoch: int
    ) -> Outbox:
        """A REPORT's answer: at the elastic job's step boundary, else as :class:`Steps`
        answers it."""
        if self._elastic is not None and self._elastic.synchronous:
            return self._elastic.report(member, rid, clock, sample) + self.elastic_changed()
        return self._steps.reply(member, rid, clock, sample, epoch)

    def _hold_joiner(self, member: Member, header: Header, out: Outbox) -> bool:
        """A DECLARE of a worker new to the running job: held for the next step
        boundary (True), or not a joiner's (False)."""
        if self._elastic is None or self._maps.map is None or not self._elastic.synchronous:
            return False
        if not self._elastic.joining(member):
            return False
        # Held for the next step boundary; refused at once if none is left (every worker
        # taking part is done already: its DECLARE came after the last DONE).
        out += self._elastic.hold(member, header) + self.elastic_changed()
        return True

    def _on_workers_ack(
        self, member: Member, header: Header, _: list[memoryview], out: Outbox
    ) -> None:
        if self._elastic is not None:
            out += self._elastic.on_ack(member.rank, header)
            out += self.elastic_changed()

    def elastic_changed(self) -> Outbox:
        """After a loss, a join or a DONE in an elastic job: barriers count the workers
        taking part, and once each of them is done, new workers still waiting for a
        step boundary are refused (no step is left to join). Never blocks."""
        if self._elastic is None:
            return []
        m = self._members
        live = [r for r in m.taking_part() if r in m.workers and not m.workers[r].finished]
        out = self._collectives.resize(len(live))
        return out + (self._elastic.refuse_held() if not live else [])

    def _on_scale_workers(self, peer: Peer, header: Header, out: Outbox) -> None:
        wanted = elastic.read_scale_workers(header)["workers"]
        if self._elastic is None or not self._elastic.synchronous:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                "workers join a job started with --max-workers K (above --workers), "
                "under --mode bsp",
            )
        m = self._members
        m.target_workers = min(max(1, wanted), m.max_workers)
        log.info("the job goes to %d workers", m.target_workers)
        out.append(
            Send(peer, elastic.scale_workers_reply(rid=header["i"], target=m.target_workers))
        )

    def _elastic_status(self) -> dict[str, Any]:
        """The elastic part of STATUS: workers taking part, lost, wanted, the shares."""
        e = self._elastic
        return {
            "taking_part": self._members.taking_part(),
            "lost_workers": sorted(
                r for r, m in self._members.workers.items() if m.state.value == "lost"
            ),
            "wanted_workers": self._members.wanted_workers(),
            "joining": e.held if e is not None else [],
            "batch_state": e.state.to_dict() if e is not None else None,
        }
