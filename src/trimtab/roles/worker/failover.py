"""A worker's side of its coordinator's failover (:mod:`trimtab.runtime.rejoin`).

A worker keeps each control request's message until its reply comes. When the
coordinator dies, its I/O thread reconnects to the same address, sends REJOIN (its
rank, and a proof of its credential over a fresh nonce) and holds every new control
request meanwhile; the training thread's data path goes on (pushes and values are the
servers'). Once a REJOINED proves the replacement holds the member key, every request
the dead coordinator left unanswered is sent again, in order, then the held ones.

First goes the worker's last broadcast value taken (its BCAST_GET, marked replayed): a
broadcast's root is answered only once every other worker took the value, so its put,
unanswered, is sent again, and the replacement must learn who took it already.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from trimtab.errors import ProtocolError
from trimtab.protocol import headers, rejoin
from trimtab.protocol.messages import Control, Header, decode, encode
from trimtab.roles.worker.config import WorkerConfig
from trimtab.runtime import credentials
from trimtab.runtime.loop import Heartbeat
from trimtab.runtime.rejoin import Rejoin
from trimtab.transport import Frame, Peer, Transport

log = logging.getLogger("trimtab.worker")


class ControlFailover:
    """The control requests unanswered, and the wait for a replacement coordinator.

    :meth:`sent` and :meth:`answered` may be called from any thread (single dict
    operations); the rest from the I/O thread only. Never blocks.

    Args:
        config: the worker's (the coordinator's address, how long to wait for a
            replacement).
        transport: the I/O thread's transport.
        coord: the coordinator's peer on it.
        heartbeat: the I/O thread's heartbeat (which notices the coordinator's silence).
    """

    def __init__(
        self, config: WorkerConfig, transport: Transport, coord: Peer, heartbeat: Heartbeat
    ) -> None:
        self._address = config.coordinator
        self._transport = transport
        self._coord = coord
        self._heartbeat = heartbeat
        self.rejoin = Rejoin(config.job, config.coordinator_timeout_s)
        self._unanswered: dict[int, list[Frame]] = {}
        self._gets: set[int] = set()  # the BCAST_GETs among them
        self._taken: list[Frame] | None = None  # the last BCAST_GET answered, replayed

    @property
    def away(self) -> bool:
        """Whether the worker waits for a replacement (control requests are held)."""
        return self.rejoin.away

    def sent(self, rid: int, message: list[Frame], op: int) -> None:
        """Control request ``rid`` (``message``, of ``op``) is on its way."""
        self._unanswered[rid] = message
        if op == Control.BCAST_GET:
            self._gets.add(rid)

    def answered(self, rid: int, op: int) -> None:
        """Control request ``rid`` was answered (by ``op``)."""
        message = self._unanswered.pop(rid, None)
        if rid in self._gets:
            self._gets.discard(rid)
            if message is not None and op == Control.BCAST_VALUE:
                header = decode(bytes(message[0]), self.rejoin.job)
                self._taken = [
                    encode(
                        headers.bcast_get(key=header["key"], replayed=True)
                        | {"i": rid, "j": self.rejoin.job}
                    )
                ]

    def check(self, token: bytes, rank: int, floor: Callable[[], int], closing: bool) -> str | None:
        """Whether the coordinator is gone: then, for a registered worker (``token``)
        that is not closing with every request answered, send REJOIN over a new
        connection and return None; else return why the job is over (or, away, why the
        wait for a replacement ended)."""
        r, transport = self.rejoin, self._transport
        lost = transport.lost()
        if r.away and self._coord not in lost:
            return r.late()
        gone = (
            "the replacement coordinator's connection closed"
            if r.away
            else self._heartbeat.gone(lost, self._coord)
        )
        if gone is None:
            return None
        if not token or (closing and not self._unanswered):
            return gone
        r.begin(gone)
        transport.reconnect(self._address)
        proof = credentials.rejoin_proof(token, r.job, "worker", r.nonce)
        header = rejoin.rejoin_worker(rank=rank, nonce=r.nonce, proof=proof, floor=floor())
        header["j"] = r.job
        transport.send(self._coord, [encode(header)])
        return None

    def take(self, header: Header, token: bytes) -> tuple[bool, list[list[Frame]]]:
        """A message from the coordinator: (whether the worker handles it as usual,
        the messages to send again). A REJOINED whose proof holds ends the wait: every
        request left unanswered goes again. While away, only ABORT, SHUTDOWN and ERROR
        (a refused REJOIN) pass."""
        op = header["o"]
        if op == Control.REJOINED:
            try:
                shown = rejoin.read_rejoined(header)["pf"]
            except ProtocolError as exc:  # no proof: as one that does not hold
                log.warning("ignored a malformed REJOINED: %s", exc)
                return False, []
            if self.rejoin.end(shown, token):
                again = [m for _, m in sorted(self._unanswered.items())]
                return False, again if self._taken is None else [self._taken, *again]
            return False, []
        if self.away and op not in (Control.ABORT, Control.SHUTDOWN, Control.ERROR):
            log.debug("ignored op %s from a coordinator not proven yet", op)
            return False, []
        return True, []
