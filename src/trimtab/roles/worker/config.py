"""How a worker joins its job (:class:`WorkerConfig`), for :mod:`.client`."""

from __future__ import annotations

import dataclasses

from trimtab.errors import ConfigError
from trimtab.transport.zmq import check_spin

__all__ = ["WorkerConfig"]


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """How a worker joins its job.

    Attributes:
        coordinator: the coordinator's address, ``tcp://host:port``.
        job: the job id.
        rank: the rank to ask for; -1 lets the coordinator choose.
        heartbeat_s: seconds between heartbeats.
        coordinator_timeout_s: the job is considered dead if the coordinator is
            silent this long.
        request_timeout_s: the longest wait for any single reply.
        spin_s: seconds a wait for a server's reply polls before it sleeps
            (``TRIMTAB_SPIN_US``; 0: it sleeps at once).
        shared_memory: whether pushes to servers on this machine may go through a
            shared-memory arena (``TRIMTAB_SHM=0`` at ``init()`` turns it off).
        credit_bytes: the push bytes sent through sockets that may be in flight to one
            server, and the value bytes it may have in flight back (P3,
            :mod:`trimtab.runtime.credit`); 0: no bound; -1: the job's chunk size
            (``TRIMTAB_CREDIT_BYTES``, -1 if unset).
        credit_ordered: held pushes go first layers first (``False``: in the order they
            were pushed, to compare; ``TRIMTAB_PRIORITY=0``).
    """

    coordinator: str
    job: str
    rank: int = -1
    heartbeat_s: float = 1.0
    coordinator_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    spin_s: float = 0.0
    shared_memory: bool = True
    credit_bytes: int = 0
    credit_ordered: bool = True

    def __post_init__(self) -> None:
        check_spin(self.spin_s)
        if self.credit_bytes < -1:
            raise ConfigError(
                f"credit_bytes must be >= 0 (0: no bound) or -1 (one chunk), "
                f"not {self.credit_bytes}"
            )
        if not self.coordinator.startswith(("tcp://", "inproc://")):
            raise ConfigError(
                f"coordinator address {self.coordinator!r} must look like tcp://HOST:PORT; "
                "set TRIMTAB_COORDINATOR or run under `trimtab run`"
            )
