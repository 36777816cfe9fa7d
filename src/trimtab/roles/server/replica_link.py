"""The server loop's side of replication (``--replicas 1``): it sends what
:class:`~trimtab.roles.server.replica.Replicas` decides, and answers what replication
brings: ACKs, REPLICATE, FAILOVER, a MIGRATE moving roles, a resent push.

A new map (FAILOVER, or MIGRATE in a job with replicas) is acknowledged to the
coordinator only once every chunk it gave a new backup is held by that backup: the
coordinator publishes the map, and the job may lose another server, only when each
chunk is on two servers again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from trimtab.errors import ProtocolError
from trimtab.protocol import headers, replica
from trimtab.protocol.messages import Data, ErrorCode, Header, error_of
from trimtab.roles.server.replica import EARLY_MAX, Moved, Release, Replicas, Waiting
from trimtab.roles.server.store import Chunk, Reply
from trimtab.runtime.loop import NodeLoop
from trimtab.transport import Peer

log = logging.getLogger("trimtab.server")


class ReplicaLink:
    """The server loop's replication executor: it sends what :class:`Replicas`
    decides and answers what replication brings (ACKs, REPLICATE, FAILOVER, a resent
    push). Kept beside the loop so the loop stays one line per case.

    Args:
        replicas: the decisions.
        loop: the server's :class:`~trimtab.runtime.loop.NodeLoop`.
        connect: the transport's ``connect`` (address -> peer).
        coordinator: the coordinator's peer.
        send_value: the server's VALUE sender ``(peer, rid, chunk, round)``, for a
            resent push of a round applied already.
        stop: stops the server with a reason (a primary fenced off).

    Not thread-safe: the server's loop owns it. Nothing blocks but sends.
    """

    def __init__(
        self,
        replicas: Replicas,
        loop: NodeLoop,
        connect: Callable[[str], Peer],
        coordinator: Peer,
        send_value: Callable[[Peer, int, Chunk, int], None],
        stop: Callable[[str], None],
    ) -> None:
        self.replicas = replicas
        self._loop = loop
        self._connect = connect
        self._coord = coordinator
        self._send_value = send_value
        self._stop = stop
        # REPLICATEs of a failover map this server has not taken yet, held until it has.
        self._early: list[tuple[Peer, list[memoryview], Header, int]] = []

    def after(self, cid: int, releases: list[Release], waiting: Waiting) -> None:
        """Run ``releases`` (send a round's replies, answering ``waiting``) once chunk
        ``cid``'s backup holds the chunk as it is now; at once if it has none. If the
        chunk leaves this server first, ``waiting`` is answered *moved* instead."""
        message = self.replicas.replicate(cid, releases, waiting)
        if message is None:
            for release in releases:
                release()
            return
        address, header, frames = message
        peer = self._connect(address)
        self.replicas.sent(header["i"], peer)
        self._loop.send(peer, header, frames)

    def after_rounds(
        self, replies: Sequence[Reply], answer: Callable[[Sequence[Reply]], None]
    ) -> None:
        """Answer ``replies`` (rounds of several chunks completed at once, e.g. by a lost
        worker: see :meth:`ChunkStore.set_workers`) chunk by chunk, each once its backup
        holds it. Never blocks."""
        if not self.replicas.backup_of and (
            len(replies) == 1 or all(r.chunk is replies[0].chunk for r in replies)
        ):  # the steady state: one round of one chunk, nothing to wait for
            answer(replies)
            return
        by_chunk: dict[int, list[Reply]] = {}
        for r in replies:
            by_chunk.setdefault(r.chunk.spec.id, []).append(r)
        if not self.replicas.backup_of:  # a job without replicas: nothing to wait for
            for rs in by_chunk.values():
                answer(rs)  # (chunk by chunk: each may be due to leave once answered)
            return
        for cid, rs in by_chunk.items():
            self.after(cid, [functools.partial(answer, rs)], [(r.peer, r.rid) for r in rs])

    def ack_after(self, cid: int, peer: Peer, rid: int) -> None:
        """ACK request ``rid`` of ``peer`` (an INIT or STATE_SET of chunk ``cid``) once the
        chunk's backup holds the chunk as it is now."""
        self.after(cid, [lambda: self._loop.send(peer, headers.ack(rid=rid))], [(peer, rid)])

    def answer(self, peer: Peer, op: int, rid: int, header: Header) -> bool:
        """An ACK or ERROR ``header`` from ``peer``: if it settles a REPLICATE, release
        what waited for it (ACK); send it again through the sockets (NO_SHM: the backup
        cannot map this server's shared memory); hold its replies (STALE_EPOCH: a newer
        map, on its way here, moves them, or the job declared this server dead); or stop
        this server (any other refusal). Whether it was one."""
        if op == Data.ERROR:
            flight = self.replicas.settle(rid, peer)
            if flight is None:
                return False
            if header.get("code") == ErrorCode.NO_SHM.value:
                log.info("server %d: replicating through the sockets", self.replicas.store.index)
                self.replicas.arenas.enabled = False
                self.after(flight.chunk, flight.releases, flight.waiting)
                return True
            if header.get("code") == ErrorCode.STALE_EPOCH.value:
                # Refused by a map this server has not taken yet (a MIGRATE moving the
                # chunk's roles, on its way here: it answers the replies *moved*), or
                # one that declared this server dead: either way its replies stay held.
                log.warning("server %d: %s", self.replicas.store.index, header.get("msg"))
                self.replicas.in_flight[rid] = flight
                flight.peer = None
                return True
            self._stop(f"replication refused by the backup: {header.get('msg')}")
            return True
        releases = self.replicas.acked(rid, peer)
        if releases is None:
            return False
        for release in releases:
            release()
        return True

    def take(self, peer: Peer, frames: list[memoryview], header: Header, sender: int) -> None:
        """A REPLICATE from server ``sender`` (credential checked): hold the copy, ACK.
        One of a map newer than this server's (its sender took a FAILOVER first) waits
        for this server's FAILOVER. Raises as :meth:`Replicas.take`, and a TOO_LARGE
        :class:`ProtocolError` past :data:`EARLY_MAX` held."""
        epoch = header.get("e")
        if type(epoch) is int and epoch > self.replicas.store.epoch:
            if len(self._early) >= EARLY_MAX:
                raise ProtocolError(
                    ErrorCode.TOO_LARGE.value, f"{EARLY_MAX} REPLICATEs of a newer map held"
                )
            self._early.append((peer, frames, header, sender))
            return
        self.replicas.take(header, frames[1:], sender)
        self._loop.send(peer, headers.ack(rid=header["i"]))

    def resent(self, peer: Peer, header: Header, chunks: dict[int, Chunk]) -> bool:
        """Whether a PUSH (``header`` decoded, credential checked) is one a worker
        resent after a failover for a round applied already: then it is answered with
        the chunk's value, and not applied again. Only after a failover (a peek of
        ``c`` and ``k``; the push's reader judges the rest)."""
        if not self.replicas.fence:
            return False
        chunk = chunks.get(header.get("c", -1))
        clock = header.get("k")
        if chunk is None or type(clock) is not int or not self.replicas.applied(chunk, clock):
            return False
        self._send_value(peer, header["i"], chunk, clock)
        return True

    def failover(self, header: Header) -> None:
        """A FAILOVER from the coordinator: promote, replicate afresh where a backup
        changed (what waited for the old one waits for the new), and FAILOVER_ACK once
        every new backup holds its chunk. Raises a MALFORMED :class:`ProtocolError` for
        a bad FAILOVER."""
        msg = replica.read_failover(header)
        epoch = msg["e"]
        store = self.replicas.store
        if not store.specs and "tensors" in header:
            store.learn_job(headers.read_job_map(header))  # joined, not yet given the job
        changed, moved = self.replicas.failover(msg)
        self._take_map(changed, moved, lambda: self._loop.send(
            self._coord, replica.failover_ack(epoch=epoch)))  # fmt: skip

    def move_roles(self, header: headers.MigrateHeader) -> None:
        """A MIGRATE (read) in a job with replicas: chunks move onto their backups and
        backups move (:meth:`Replicas.remap`); MIGRATE_ACK (no cuts: the map holds from
        the round each chunk is at) once every new backup holds its chunk."""
        store = self.replicas.store
        if not store.specs:
            store.learn_job(header)  # a server that joined after the job started
        backups = replica.read_backups(header, len(store.specs))
        epoch = header["epoch"]
        changed, moved = self.replicas.remap(
            tuple(header["owners"]), backups, tuple(header["servers"]), epoch
        )
        self._take_map(changed, moved, lambda: self._loop.send(
            self._coord, headers.migrate_ack(epoch=epoch, cuts={})))  # fmt: skip

    def _take_map(self, changed: list[int], moved: Moved, ack: Callable[[], None]) -> None:
        """After a remap: answer ``moved`` *moved*, replicate each ``changed`` chunk
        afresh, ``ack`` once all of them are held by their backups, then take the
        REPLICATEs that came before the map."""
        store = self.replicas.store
        for peer, rid, cid in moved:
            owner = store.owners[cid]
            self._loop.send(peer, headers.moved(rid=rid, chunk=cid, owner=owner, epoch=store.epoch))
        left = len(changed)

        def one_held() -> None:
            nonlocal left
            left -= 1
            if left == 0:
                ack()

        for cid in changed:
            releases, waiting = self.replicas.resync(cid)
            self.after(cid, [*releases, one_held], waiting)
        if not changed:
            ack()
        early, self._early = self._early, []
        for peer, frames, held, sender in early:
            try:
                self.take(peer, frames, held, sender)
            except ProtocolError as exc:
                code, text = error_of(exc)
                self._loop.refuse(peer, held["i"], code, text, data=True)
