"""How a server starts."""

from __future__ import annotations

import dataclasses

from trimtab.errors import ConfigError
from trimtab.transport.spin import check_spin


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """How a server starts.

    Attributes:
        coordinator: the coordinator's address, ``tcp://host:port``.
        job: the job id; messages of other jobs are refused.
        host: interface to bind (loopback by default).
        port: port to bind; 0 picks a free one.
        heartbeat_s: seconds between heartbeats to the coordinator.
        coordinator_timeout_s: exit if the coordinator is silent this long.
        max_frame_bytes: a frame over this closes the sender's connection.
        priority: of the pushes queued at once, merge those of lower chunk ids (the
            first layers, in ``named_parameters`` order) first, so that their values
            return first and the next forward can start (P3); off only to compare.
        spin_s: seconds a server waiting for its next message polls before it sleeps
            (``TRIMTAB_SPIN_US`` for ``trimtab server``; 0: it sleeps at once).
        shared_memory: whether a chunk's replica may go to a backup on this machine
            through shared memory (``TRIMTAB_SHM=0`` for ``trimtab server``: no).
        server_key: the job's server key (``TRIMTAB_SERVER_KEY``): its join ticket lets
            this server join a running job (:mod:`trimtab.runtime.credentials`).
    """

    coordinator: str
    job: str
    host: str = "127.0.0.1"
    port: int = 0
    heartbeat_s: float = 1.0
    coordinator_timeout_s: float = 30.0
    max_frame_bytes: int = 64 << 20
    priority: bool = True
    spin_s: float = 0.0
    shared_memory: bool = True
    server_key: bytes = dataclasses.field(default=b"", repr=False)

    def __post_init__(self) -> None:
        check_spin(self.spin_s)
        if not self.coordinator.startswith(("tcp://", "inproc://")):
            raise ConfigError(
                f"coordinator address {self.coordinator!r} must look like tcp://HOST:PORT"
            )
        if self.heartbeat_s <= 0 or self.coordinator_timeout_s <= self.heartbeat_s:
            raise ConfigError("need 0 < heartbeat_s < coordinator_timeout_s")
