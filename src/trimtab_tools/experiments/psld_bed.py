"""``trimtab experiment psld --testbed``: the servers' links shaped by the kernel.

Instead of a token bucket in each server's Python (``--straggler
server:S:bandwidth=...``), every role runs on a host of a test bed
(:mod:`trimtab.launch.testbed`): server ``s`` on host ``s``, one spare server host
after them (where the launcher starts the server psld's scale-out asks for), the
workers on hosts of their own; ``tc`` shapes each server host's link to ``--link``
(both ways), the scenario's slow server's to ``--link / --slowdown``. The workers'
hosts are not shaped.

Only scenarios whose slow server stays the same can be shaped once for the whole run
(``bandwidth``, ``skew``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from trimtab.launch.hosts import Layout
from trimtab.launch.testbed import Testbed, unavailable

__all__ = ["SHAPED", "SLOW_HOST", "layout", "rank_on", "shaped_bed"]

#: The scenarios a bed can run (their links do not change during a run).
SHAPED = ("bandwidth", "skew")
#: The host of the ``bandwidth`` scenario's slow server: a host, not a rank (the server
#: started there registers with the coordinator in any order among the others, so its
#: rank is any of 0 to 3; :func:`rank_on` finds it from the run record).
SLOW_HOST = 3


def rank_on(addrs: Mapping[str, str] | Mapping[int, str], address: str) -> int | None:
    """The rank of the server that serves on host ``address`` (an IP), from each
    server's address (``rank -> "tcp://host:port"`` or ``"host:port"``, as the run
    record's ``member`` events give them); None if none does (an older record without
    addresses). Pure."""
    for rank, addr in addrs.items():
        host = addr.split("//")[-1].rsplit(":", 1)[0]
        if host == address:
            return int(rank)
    return None


@contextlib.contextmanager
def shaped_bed(
    scenario: str, servers: int, workers: int, link_bytes_s: float, slowdown: float
) -> Iterator[Testbed]:
    """A bed of ``servers + 1 + workers`` hosts, server hosts (the spare one too) shaped
    for ``scenario``; removed on exit. Blocks to make and remove it. Raises RuntimeError
    where no bed can be made here or for a scenario it cannot shape."""
    if scenario not in SHAPED:
        raise RuntimeError(f"--testbed shapes the links once: scenarios {SHAPED}, not {scenario}")
    why = unavailable()
    if why is not None:
        raise RuntimeError(f"no test bed here: {why}")
    with Testbed(servers + 1 + workers) as bed:
        for s in range(servers + 1):
            rate = link_bytes_s / (slowdown if scenario == "bandwidth" and s == SLOW_HOST else 1)
            bed.shape(s, rate_mbit=rate * 8 / 1e6)
        yield bed


def layout(bed: Testbed, servers: int) -> Layout:
    """Where a job of ``servers`` runs on a :func:`shaped_bed`: server ``s`` on host
    ``s`` (a server added later, on the spare host ``servers``), the coordinator with
    server 0, the workers on the hosts after the spare one. Never blocks."""
    hosts = bed.hosts
    return Layout(
        coordinator=hosts[0],
        servers=tuple(hosts[: servers + 1]),
        workers=tuple(hosts[servers + 1 :]),
    )
