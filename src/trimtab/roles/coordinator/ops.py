"""The coordinator's handlers of each op, as a part of
:class:`~trimtab.roles.coordinator.node.Coordinator` (a mixin: the loop's module keeps
the loop, the dispatch and the pieces' construction): the ops anyone who passed the
transport's authentication may send (REGISTER, STATUS, SCALE), and those of registered
members (heartbeats, declarations, map acknowledgements and requests, step and load
reports, a worker leaving or done, migrations' acknowledgements, the collectives). Each
appends what is to be sent to the outbox it is given; it raises
:class:`~trimtab.errors.ProtocolError` for a request to refuse (nothing changed then).
Loop thread only; never blocks."""

from __future__ import annotations

import logging
import time
from typing import Any

from trimtab.errors import ProtocolError
from trimtab.policies.psld import SpeedEstimator
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.collectives import Part
from trimtab.roles.coordinator.lost import MemberLoss
from trimtab.roles.coordinator.members import Member, Role
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.roles.coordinator.rebalance import Rebalancer
from trimtab.roles.coordinator.watch import Watch
from trimtab.runtime import credentials
from trimtab.transport import Peer

log = logging.getLogger("trimtab.coordinator")


class MemberOps(MemberLoss):
    """The coordinator's op handlers (see the module). The attributes are the
    coordinator's."""

    _rebalancer: Rebalancer
    _speeds: SpeedEstimator
    _ticket: bytes | None
    watch: Watch

    def status(self) -> dict[str, Any]:
        raise NotImplementedError  # the coordinator's

    # -- ops anyone may send ---------------------------------------------------------

    def _on_register(self, peer: Peer, header: Header, out: Outbox) -> None:
        if self._rejoins is not None and not self._rejoins.rebuilt:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "the job's members rejoin first")
        running = self._maps.map is not None
        if headers.read_register(header)["role"] == Role.SERVER.value:
            credentials.admit_server(self._ticket, header, running=running)
        member = self._members.register(peer, header, running=running)
        c = self.config
        server = member.role is Role.SERVER
        registered = headers.registered(
            rid=header["i"],
            rank=member.rank,
            num_workers=c.num_workers,
            num_servers=c.num_servers,
            chunk_bytes=c.chunk_bytes,
            heartbeat_s=c.heartbeat_s,
            token=credentials.credential(self._key, c.job, member.role.value, member.rank),
            key=self._key if server else None,
        )
        out.append(Send(peer, registered))
        if member.role is Role.WORKER:
            self._collectives.returned(member.rank)  # back after it left, if it had
        if member.role is Role.SERVER and running:
            self._rebalancer.membership_changed(out)  # a server joined a running job
        self._place(out)

    def _on_status(self, peer: Peer, header: Header, out: Outbox) -> None:
        out.append(Send(peer, headers.status_reply(rid=header["i"], status=self.status())))

    def _on_scale(self, peer: Peer, header: Header, out: Outbox) -> None:
        target = self._rebalancer.scale(headers.read_scale(header)["servers"], out)
        out.append(Send(peer, headers.scale_reply(rid=header["i"], target=target)))

    # -- ops of registered members ---------------------------------------------------

    def _floor(self, member: Member, header: Header, out: Outbox) -> None:
        """A worker's ``lo`` (in MAP_GET, REPORT and heartbeats): the oldest map by which
        it still has a request in flight. Raises a MALFORMED :class:`ProtocolError` if it
        is not an integer."""
        if member.role is not Role.WORKER:
            return
        floor = headers.read_floor(header)
        if floor is not None and self._members.raise_floor(member, floor):
            self._rebalancer.retire(out)

    def _on_heartbeat(
        self, member: Member, header: Header, _: list[memoryview], out: Outbox
    ) -> None:
        out.append(Send(member.peer, headers.heartbeat_echo(header, time.time())))
        self._floor(member, header, out)

    def _on_declare(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        def clock_of(table: int) -> int:
            # As the worker said when it left, else its last step report's.
            known = member.clocks
            return known[table] if table < len(known) else self._steps.clocks.get(member.rank, 0)

        if self._hold_joiner(member, header, out):  # joins the running job at a boundary
            return
        again = self._maps.again(member, header, self._members, clock_of)
        if again:  # a table the job has: a worker's optimizer after init() again
            out += again
            return
        self._maps.declare(member, header)
        self._place(out)

    def _place(self, out: Outbox) -> None:
        """The first map, or a table every worker declared (see :meth:`Maps.place`)."""
        out += self._rebalancer.place()

    def _on_map_ack(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        out += self._maps.ack(member.rank, self._members)
        if not self._maps.pending and self._members.unsettled():
            # A server that joined while a table's chunks were being placed.
            self._rebalancer.membership_changed(out)

    def _on_map_get(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        wanted = headers.read_map_get(header)["e"]
        self._floor(member, header, out)
        out += self._maps.want(member.peer, header["i"], wanted)

    def _on_report(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        clock, sample = self._steps.record(member, header)  # checks it (read_report)
        self.watch.step(member.rank, clock, sample)
        self._floor(member, header, out)
        psld = self._rebalancer.psld
        if psld is not None:
            psld.observe_step(clock, sample.compute_s + sample.comm_s)
        spans, servers = headers.read_report(header).get("sv", []), len(self._members.servers)
        speeds = None if psld is None else self._speeds  # the spans feed PSLD's figures
        self.watch.traffic(clock, self._steps.observe_traffic(clock, spans, servers, speeds))
        boundary = self._steps.boundary()
        if boundary is not None:
            self._rebalancer.step_boundary(boundary, out)
        epoch = self._maps.published_epoch
        out += self._answer_report(member, header["i"], clock, sample, epoch)

    def _on_leave(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        # No collective is refused for it yet: it may init() again and join them.
        self._members.worker_left(member, headers.read_leave(header)["k"])
        out.append(Send(member.peer, headers.ok(rid=header["i"])))

    def _on_done(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        if (failed := headers.read_done(header)) is not None:  # lost, not done
            out.append(Send(member.peer, headers.ok(rid=header["i"])))
            return self.member_lost(member, f"it failed: {failed}")
        everyone = self._members.worker_done(member)
        out.append(Send(member.peer, headers.ok(rid=header["i"])))
        out += self._collectives.left(member.rank)  # no collective waits for it forever
        out += self.elastic_changed()
        if everyone:
            log.info("every worker is done; shutting the job down")
            out += self._members.shutdown()
            self._stop = True

    def _on_migrate_ack(
        self, member: Member, header: Header, _: list[memoryview], out: Outbox
    ) -> None:
        self._rebalancer.on_ack(member.rank, header, out)

    def _on_handed(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        self._rebalancer.on_handed(header, out)

    def _on_load(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        if member.role is not Role.SERVER:
            return
        load = headers.read_load(header)
        self._speeds.observe(member.rank, float(load["busy"]), float(load["bytes"]))
        self.watch.load(
            member.rank, float(load["busy"]), float(load["bytes"]), load["n"], load.get("bo"),
            load.get("gr"),
        )  # fmt: skip
        # The job's clock, so that a server owning nothing still knows the step (its
        # straggler schedule, for one, follows it).
        out.append(Send(member.peer, headers.job_clock(clock=self._steps.job_clock)))

    def _on_barrier(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        out += self._collectives.barrier(
            member.peer, header["i"], headers.read_barrier(header)["name"]
        )

    def _on_adopt(self, member: Member, header: Header, _: list[memoryview], out: Outbox) -> None:
        job, key = self.config.job, self._key
        out += self._collectives.adopt(
            member.peer,
            header["i"],
            headers.read_adopt(header)["root"],
            lambda root, n: credentials.adoption_grant(key, job, root, n),
        )

    def _on_bcast_put(
        self, member: Member, header: Header, frames: list[memoryview], out: Outbox
    ) -> None:
        put = headers.read_bcast_put(header)
        out += self._collectives.put(
            member.peer, header["i"], member.rank, put["key"], put["meta"], frames
        )

    def _on_bcast_get(
        self, member: Member, header: Header, _: list[memoryview], out: Outbox
    ) -> None:
        get = headers.read_bcast_get(header)
        out += self._collectives.get(
            member.peer, header["i"], member.rank, get["key"], replayed=bool(get.get("rp"))
        )

    def _on_gather(
        self, member: Member, header: Header, frames: list[memoryview], out: Outbox
    ) -> None:
        if member.role is not Role.WORKER:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "only workers join collectives")
        g = headers.read_gather(header)
        part = Part(member.peer, header["i"], g["sig"], g["meta"], frames)
        out += self._collectives.gather(member.rank, g["key"], part)
