"""A server's link to its coordinator beside the data path: heartbeats, load reports for
PSLD, and the coordinator's failover (:mod:`trimtab.runtime.rejoin`): a server serving a
job whose coordinator died reconnects to the same address and tells the replacement
who it is and what it holds (REJOIN), while its workers' pushes go on being served."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from trimtab.protocol import headers, rejoin
from trimtab.protocol.messages import Control, Header
from trimtab.protocol.rejoin import RejoinHeader
from trimtab.roles.server.config import ServerConfig
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.store import ChunkStore
from trimtab.runtime.loop import Heartbeat, NodeLoop
from trimtab.runtime.rejoin import Rejoin
from trimtab.runtime.trace import Trace
from trimtab.transport import Transport

log = logging.getLogger("trimtab.server")

#: Seconds between load reports (busy time, bytes) to the coordinator, for PSLD.
LOAD_REPORT_S = 0.25

#: What a server takes from a coordinator it has not seen prove itself (after its
#: coordinator died): its proof, or the end of the job.
_WHILE_AWAY = frozenset({Control.REJOINED, Control.ABORT, Control.ERROR, Control.SHUTDOWN})


class CoordinatorLink:
    """Heartbeats, load reports and failover. Loop thread only; never blocks.

    Args:
        config: the server's.
        transport: its transport (the coordinator's connection is opened here).
        loop: its loop's helpers.
        meter: its load figures.
        rejoin_header: the REJOIN to send a replacement, given the outage's nonce; None
            while this server cannot rejoin (not registered, or no job map yet).
    """

    def __init__(
        self,
        config: ServerConfig,
        transport: Transport,
        loop: NodeLoop,
        meter: LoadMeter,
        rejoin_header: Callable[[bytes], RejoinHeader | None],
    ) -> None:
        self._config = config
        self._transport = transport
        self._loop = loop
        self._meter = meter
        self._rejoin_header = rejoin_header
        #: The coordinator's peer (the same for its replacements: same address).
        self.peer = transport.connect(config.coordinator)
        self.heartbeat = Heartbeat(config.heartbeat_s, config.coordinator_timeout_s)
        self.rejoin = Rejoin(config.job, config.coordinator_timeout_s)
        self._load_due = 0.0
        self.trace: Trace | None = None  # --trace: heartbeats sync its clock
        #: A growing table's counters on this server's chunks, for the load reports.
        self.growing: Callable[[], dict[str, int]] = dict

    def beat(self) -> None:
        """A heartbeat, if one is due."""
        if self.heartbeat.due():
            self._loop.send(self.peer, self.heartbeat.header(self.trace))

    def tick(self, serving: bool) -> str | None:
        """Call on every turn of the loop: a heartbeat and (``serving``) a load report
        when due, and, with each heartbeat or closed connection, a look at the
        coordinator: gone, it is rejoined where the server can (else, or once a
        replacement is late, returns why the server gives up)."""
        if serving and not self.rejoin.away and time.monotonic() >= self._load_due:
            self._load_due = time.monotonic() + LOAD_REPORT_S
            m = self._meter
            load = headers.load(
                busy_s=m.busy_s, nbytes=m.bytes, requests=m.requests, step=m.step,
                bytes_out=m.bytes_out,
            )  # fmt: skip
            growing = self.growing()
            if growing:
                load["gr"] = growing
            self._loop.send(self.peer, load)
        lost = self._transport.lost()  # (connections closed: seen at once)
        beat = self.heartbeat.due()
        if beat:
            self._loop.send(self.peer, self.heartbeat.header(self.trace))
        elif not lost:
            return None
        if self.rejoin.away:
            closed = self.peer in lost
            gone = "the replacement coordinator's connection closed" if closed else None
        else:
            gone = self.heartbeat.gone(lost, self.peer)
        if gone is None:
            return self.rejoin.late()
        self.rejoin.begin(gone)
        header = self._rejoin_header(self.rejoin.nonce)
        if header is None:
            return gone
        self._transport.reconnect(self._config.coordinator)
        self._loop.send(self.peer, header)
        return None

    def take(self, header: Header) -> bool:
        """Whether to handle the coordinator's message ``header``: a REJOINED is taken
        here (if its proof holds, the job goes on under the replacement); while the
        server waits for a replacement's proof only ABORT and ERROR pass."""
        op = header["o"]
        if op == Control.HEARTBEAT:
            self.heartbeat.echoed(header, self.trace)
        if op == Control.REJOINED:
            shown = rejoin.read_rejoined(header)["pf"]
            if self.rejoin.end(shown, self._config.server_key):
                self.heartbeat.heard()
            return False
        if self.rejoin.away and op not in _WHILE_AWAY:
            log.debug("ignored op %s from a coordinator not proven yet", op)
            return False
        return True


def held_job_map(store: ChunkStore, backups: Sequence[int]) -> dict[str, Any]:
    """The job map as ``store`` holds it now (a REJOIN's ``jm``): the tables it was
    told (:attr:`ChunkStore.job`) with the current epoch, owners, servers, workers and
    ``backups`` (if any). Pure."""
    live = {"epoch": store.epoch, "owners": list(store.owners), "servers": list(store.servers)}
    job_map = {**store.job, **live, "workers": sorted(store.workers)}
    if backups:
        job_map["bk"] = list(backups)
    return job_map
