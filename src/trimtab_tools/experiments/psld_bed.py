"""``trimtab experiment psld --testbed``: the servers' links shaped by the kernel.

Instead of a token bucket in each server's Python (``--straggler
server:S:bandwidth=...``), every role runs on a host of a test bed
(:mod:`trimtab.launch.testbed`): server ``s`` on host ``s``, the workers on hosts of
their own, and ``tc`` shapes each server host's link to ``--link`` (both ways), the
scenario's slow server's to ``--link / --slowdown``. The workers' hosts are not shaped.

Only scenarios whose slow server stays the same can be shaped once for the whole run
(``bandwidth``, ``skew``); and the launcher cannot add a server on a bed (no scale-out),
so ``psld`` there runs as ``psld_fixed`` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from trimtab.launch.testbed import Testbed, unavailable

__all__ = ["SHAPED", "SLOW_SERVER", "shaped_bed"]

#: The scenarios a bed can run (their links do not change during a run).
SHAPED = ("bandwidth", "skew")
#: The slow server of the ``bandwidth`` scenario (as its ``--straggler`` specs have it).
SLOW_SERVER = 3


@contextlib.contextmanager
def shaped_bed(
    scenario: str, servers: int, workers: int, link_bytes_s: float, slowdown: float
) -> Iterator[Testbed]:
    """A bed of ``servers + workers`` hosts, server hosts shaped for ``scenario``;
    removed on exit. Blocks to make and remove it. Raises RuntimeError where no bed can
    be made here or for a scenario it cannot shape."""
    if scenario not in SHAPED:
        raise RuntimeError(f"--testbed shapes the links once: scenarios {SHAPED}, not {scenario}")
    why = unavailable()
    if why is not None:
        raise RuntimeError(f"no test bed here: {why}")
    with Testbed(servers + workers) as bed:
        for s in range(servers):
            rate = link_bytes_s / (slowdown if scenario == "bandwidth" and s == SLOW_SERVER else 1)
            bed.shape(s, rate_mbit=rate * 8 / 1e6)
        yield bed
