"""Where each role of a launched job runs: this machine, or a host of a test bed.

On a bed (:mod:`trimtab.launch.testbed`) every role is started inside its host's
network namespace (``ip netns exec``), binds and advertises that host's address, and
reaches roles of other hosts over the bed's links, by TCP: shared memory and the local
lane are for roles of one host (:mod:`trimtab.transport.hostid`).

The layout is one rule, :func:`place`: the coordinator on host 0; server ``i`` on host
``i mod N``; worker ``r`` on host ``(S + r) mod N``. On 4 hosts, 2 servers and 2
workers: the coordinator and server 0 on host 0, server 1 on host 1, the workers on
hosts 2 and 3, each role on its own host but the coordinator's light traffic. Servers
count in the order the launcher starts them; the coordinator ranks them in the order
they register, which may differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trimtab.launch.testbed import Host

__all__ = ["Layout", "place"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """The host of each role (None everywhere: this machine, as without a bed).

    Attributes:
        coordinator: the coordinator's host.
        servers: server ``i``'s host is ``servers[i % len(servers)]`` (servers added
            later too).
        workers: by rank.
    """

    coordinator: Host | None = None
    servers: tuple[Host | None, ...] = (None,)
    workers: tuple[Host | None, ...] = ()

    def server(self, index: int) -> Host | None:
        """Server ``index``'s host."""
        return self.servers[index % len(self.servers)]

    def worker(self, rank: int) -> Host | None:
        """Worker ``rank``'s host (this machine for a rank the layout does not know)."""
        return self.workers[rank] if rank < len(self.workers) else None

    def local(self, rank: int, workers: int) -> tuple[int, int, int, int]:
        """Worker ``rank``'s (local rank, local size, cross rank, cross size) in a job of
        ``workers``: its place among the workers of its host, and its host's among the
        hosts with workers (Horovod's ``local_rank()``, ``local_size()``,
        ``cross_rank()``, ``cross_size()``). Without a bed: one machine."""
        host = self.worker(rank)
        if host is None:
            return rank, workers, 0, 1
        peers = [r for r, h in enumerate(self.workers) if h == host]
        hosts = list(dict.fromkeys(h.namespace for h in self.workers if h is not None))
        return peers.index(rank), len(peers), hosts.index(host.namespace), len(hosts)

    def run(self, host: Host | None, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host`` (as it is on this machine)."""
        return list(argv) if host is None else host.argv(argv)

    def address(self, host: Host | None, default: str) -> str:
        """The address roles on ``host`` bind (``default`` on this machine)."""
        return default if host is None else host.address


def place(hosts: Sequence[Host], servers: int, workers: int) -> Layout:
    """The layout of a job of ``servers`` and ``workers`` on ``hosts`` (see the module's
    rule). Never blocks. Raises ``ValueError`` without hosts."""
    if not hosts:
        raise ValueError("a layout on a bed needs at least one host")
    n = len(hosts)
    return Layout(
        coordinator=hosts[0],
        servers=tuple(hosts),
        workers=tuple(hosts[(servers + r) % n] for r in range(workers)),
    )
