"""The server's control plane, as a part of :class:`~trimtab.roles.server.node.Server`
(a mixin: the loop's module stays short): the coordinator's messages (registration,
the job map, migrations, replicas' roles and failovers, checkpoints, workers lost or
joined, the job's end) and this server's REJOIN for a coordinator that replaced a dead
one. Runs on the server's loop thread; never blocks."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from trimtab.errors import ProtocolError
from trimtab.protocol import elastic, headers, rejoin, replica
from trimtab.protocol.messages import Control, Header, decode, error_of, read_error
from trimtab.protocol.rejoin import RejoinHeader
from trimtab.roles.server import checkpoint
from trimtab.roles.server.batches import Batches
from trimtab.roles.server.config import ServerConfig
from trimtab.roles.server.coordlink import CoordinatorLink, held_job_map
from trimtab.roles.server.handover import Handover
from trimtab.roles.server.joining import Joining
from trimtab.roles.server.lifecycle import ServerState
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.receipt import Receipts
from trimtab.roles.server.replica_link import ReplicaLink
from trimtab.roles.server.store import ChunkStore, Reply
from trimtab.runtime import credentials
from trimtab.runtime.credentials import Credentials
from trimtab.runtime.loop import NodeLoop
from trimtab.transport import Peer, Transport

log = logging.getLogger("trimtab.server")


class ControlPlane:
    """The coordinator's side of a server (see the module). Not thread-safe: the
    server's loop owns it."""

    config: ServerConfig
    state: ServerState
    meter: LoadMeter
    _transport: Transport
    _loop: NodeLoop
    _link: CoordinatorLink
    _coord: Peer
    _store: ChunkStore
    _credentials: Credentials
    _receipts: Receipts
    _batches: Batches
    _handover: Handover
    _joining: Joining
    _replicas: ReplicaLink
    _checkpoints: checkpoint.ServerCheckpoints
    _stop: bool
    _abort: str | None
    on_serving: Callable[[], None] | None

    @property
    def index(self) -> int:
        raise NotImplementedError

    @property
    def address(self) -> str:
        raise NotImplementedError

    def _serve(self, peer: Peer, frames: list[memoryview], header: Header | None) -> None:
        raise NotImplementedError

    def _on_data(self, peer: Peer, frames: list[memoryview], header: Header | None = None) -> None:
        raise NotImplementedError

    def _answer(self, replies: Sequence[Reply]) -> None:
        raise NotImplementedError

    def _on_control(self, frames: list[memoryview]) -> None:
        try:
            header = decode(frames[0], self.config.job)
        except ProtocolError as exc:
            log.error("undecodable message from the coordinator: %s", exc)
            return
        try:
            if self._link.take(header):
                self._control(header)
        except ProtocolError as exc:  # a reader's: the coordinator's terms are unknown
            self._abort = f"malformed message from the coordinator: {error_of(exc)[1]}"
            self._stop = True
        except Exception:  # a bug: logged; the loop goes on
            log.exception("internal error on a message from the coordinator")

    def _control(self, header: Header) -> None:
        """Handle a decoded control message; raises a reader's MALFORMED ProtocolError."""
        op = header["o"]
        if op == Control.REGISTERED:
            registered = headers.read_registered(header)
            self._store.index = registered["rank"]
            key = registered.get("key")
            if key is not None:
                self._credentials.learn(key, registered["num_workers"], registered.get("t"))
            self.state = ServerState.SERVING
            log.info("server %d serving at %s", self.index, self.address)
            for held in self._joining.release():
                self._serve(*held)
            if self.on_serving is not None:  # once: a REGISTERED after a rejoin is not
                hook, self.on_serving = self.on_serving, None
                hook()
        elif op == Control.MAP:
            self._apply_map(headers.read_job_map(header))
            self._loop.send(self._coord, headers.map_ack(rid=header["i"], epoch=self._store.epoch))
            self._checkpoints.mapped()  # a resumed job's chunks, loaded (RESTORE came first)
        elif op in checkpoint.OPS:
            self._checkpoints.control(header)
        elif op == Control.EXTEND:
            added = self._store.extend(headers.read_extend(header))
            self._replicas.replicas.learn(headers.read_extend(header))
            log.info("server %d: the job has %d chunks now (epoch %d); %d new ones are mine",
                     self.index, len(self._store.specs), self._store.epoch, len(added))  # fmt: skip
            self._loop.send(self._coord, headers.map_ack(rid=header["i"], epoch=self._store.epoch))
        elif op == Control.MIGRATE and ("bk" in header or self._replicas.replicas.backup_of):
            # Roles, not bytes (a job with replicas; "bk" tells a server that just joined).
            self._replicas.move_roles(headers.read_migrate(header))
        elif op == Control.MIGRATE:
            cuts = self._handover.plan(headers.read_migrate(header))
            self._loop.send(self._coord, headers.migrate_ack(epoch=self._store.epoch, cuts=cuts))
            for cid in self._handover.leaving():
                self._hand_over(cid)
            for peer, frames in self._handover.take_early():
                self._on_data(peer, frames)
        elif op == Control.WORKERS:  # a worker was lost or joined: answer what waited
            ws = elastic.read_workers(header)
            self._credentials.admit(ws["ws"])
            self._receipts.workers(ws["ws"])
            self._replicas.after_rounds(self._store.set_workers(ws["ws"]), self._answer)
            self._batches.workers(ws["ws"])  # (after the rounds it let complete)
            self._loop.send(self._coord, elastic.workers_ack(generation=ws["g"]))
        elif op == Control.OK and "k" in header:
            # The job's clock (answering LOAD), for a server with little to do.
            self.meter.advance(headers.read_job_clock(header)["k"])
        elif op == Control.SHUTDOWN:
            log.info("server %d: job finished, shutting down", self.index)
            self._stop = True
        elif op == Control.FAILOVER:
            self._replicas.failover(header)
        elif op == Control.HOLDINGS:
            epoch = replica.read_holdings(header)["e"]
            rounds = self._replicas.replicas.holdings()
            self._loop.send(self._coord, replica.held(epoch=epoch, rounds=rounds))
        elif op == Control.ABORT:
            self._abort = headers.read_abort(header)["why"]
            self._stop = True
        elif op == Control.ERROR:
            self._abort = f"coordinator refused us: {read_error(header)['msg']}"
            self._stop = True

    def _apply_map(self, header: headers.JobMapHeader) -> None:
        store = self._store
        store.apply_map(header)
        self._replicas.replicas.learn(header)
        log.info(
            "server %d owns %d of %d chunks (epoch %d, %s mode)",
            self.index,
            len(store.chunks),
            len(store.specs),
            store.epoch,
            store.mode.value,
        )

    def _hand_over(self, cid: int) -> None:
        """Send chunk ``cid`` to its new owner if it is ready to go."""
        message = self._handover.ready(cid)
        if message is not None:
            address, header, frames = message
            peer = self._transport.connect(address)
            self._handover.moves[cid].peer = peer  # only its ACK settles the handover
            self._loop.send(peer, header, frames)

    def _rejoin(self, nonce: bytes) -> RejoinHeader | None:
        """This server's REJOIN for a coordinator that replaced a dead one (see
        :mod:`.coordlink`), or None before it serves a job (nothing to rejoin)."""
        key = self._credentials.key
        if self.state is not ServerState.SERVING or key is None or not self._store.job:
            return None
        server_key, job = self.config.server_key, self.config.job
        return rejoin.rejoin_server(
            rank=self.index,
            nonce=nonce,
            addr=self.address,
            masked_key=credentials.masked(key, credentials.key_mask(server_key, job, nonce)),
            job_map=held_job_map(self._store, self._replicas.replicas.backup_of),
            moving=bool(self._store.moves),
            ticket=credentials.join_ticket(server_key, job) if server_key else None,
            adopted=max((c.adopted for c in self._store.chunks.values()), default=0),
        )
