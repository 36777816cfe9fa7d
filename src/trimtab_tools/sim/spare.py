"""PSLD's figures while validate-sim's spare server starts, against after it joined.

The bandwidth job's scaling policy asks for a spare server at its first steps; on the
test bed that process starts (imports, registration: about half a core for 2 to 3 s)
on the two cores the job's hosts share, and joins 17 to 41 steps later, so nearly all
of the first 20 steps that ``decisions_match`` compares run beside it. Over 16 bed
records of 2026-11-29 (issue 38, tenth round) the fast servers' upper bounds read 0.80
to 1.01 of their level after the join while it started (median 0.89), and every
server's figures scattered 0.05 to 0.14 about their running medians (median 0.11),
where after the join they scatter 0.06 (median) and on the calm run 0.03 to 0.055.
PSLD's errors on the bed at clocks 12 to 15 were then up to 0.18; the simulated ones,
from the calm run's noise, 0.02 to 0.07. The simulator's hosts have cores of their own,
so it has neither: its fast servers' level is the bed's after the join.
:func:`from_record` and :func:`from_trace` measure both on a run record and on a
simulated run, the same way, so that each sitting shows them side by side. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trimtab_tools.sim.noise import deviations, scatter
from trimtab_tools.sim.trace import Trace

__all__ = ["AFTER_STEPS", "FIRST_STEP", "figures", "from_record", "from_trace"]

#: The first step compared: PSLD's first move holds from step 2, and a step's figures
#: before it are the first map's (eight chunks a server, not ten).
FIRST_STEP = 3
#: Steps after the join compared, from the third after it (the join's own migration
#: lands in the two before).
AFTER_STEPS = 40


def figures(
    upper: Mapping[int, Sequence[tuple[int, float]]], join: int, servers: int, slow: int
) -> dict[str, Any] | None:
    """The starting and after-join figures of ``upper`` (per server, its ``(step,
    upper bound in bytes/s)`` in step order) for a job of ``servers`` servers at its
    start whose spare joined after step ``join``, ``slow`` the shaped one:
    ``fast_upper_mbs`` (the other servers' median upper bound, MB/s, over steps
    :data:`FIRST_STEP` to ``join`` and over the :data:`AFTER_STEPS` from ``join + 3``),
    ``fast_level`` (the first over the second), ``slow_upper_mbs`` (the slow server's
    median while the spare started), ``fast_slow`` (the fast over the slow while it
    started, and after, the fast after over the slow while starting: the ratio PSLD's
    plans for the slow server's last chunks follow), ``scatter`` (the upper bounds' log
    deviations from each server's running median, :func:`~trimtab_tools.sim.noise.scatter`,
    pooled over the starting servers: while it started, after). None where a part has no
    figure. Pure; raises ValueError for a figure not > 0."""
    during: list[float] = []
    after: list[float] = []
    slow_during: list[float] = []
    spread: tuple[list[float], list[float]] = ([], [])
    last = join + 3 + AFTER_STEPS
    for server, row in upper.items():
        if server >= servers or not row:
            continue
        devs = deviations([v for _, v in row])
        for (step, value), dev in zip(row, devs, strict=True):
            starting = FIRST_STEP <= step <= join
            joined = join + 3 <= step < last
            if starting:
                spread[0].append(dev)
                (slow_during if server == slow else during).append(value)
            elif joined:
                spread[1].append(dev)
                if server != slow:
                    after.append(value)
    if not (during and after and slow_during):
        return None
    fast_during, fast_after = statistics.median(during), statistics.median(after)
    slow_mbs = statistics.median(slow_during)
    return {
        "join_step": join,
        "fast_upper_mbs": [round(fast_during / 1e6, 1), round(fast_after / 1e6, 1)],
        "fast_level": round(fast_during / fast_after, 3),
        "slow_upper_mbs": round(slow_mbs / 1e6, 1),
        "fast_slow": [round(fast_during / slow_mbs, 2), round(fast_after / slow_mbs, 2)],
        "scatter": [round(scatter(spread[0]), 4), round(scatter(spread[1]), 4)],
    }


def from_record(
    events: Iterable[Mapping[str, Any]], servers: int, slow: int | None
) -> dict[str, Any] | None:
    """:func:`figures` of a PSLD run record's events (``events.jsonl``'s, in order):
    the ``traffic`` events' upper bounds (a step's bytes over its shortest wait span),
    the join as the last step any worker had reported when the first server past the
    job's ``servers`` joined. None without a join, a slow server or figures. Pure."""
    if slow is None:
        return None
    upper: dict[int, list[tuple[int, float]]] = {}
    reported = -1
    join = None
    for e in events:
        kind = e.get("kind")
        if kind == "step":
            reported = max(reported, int(e.get("clock", -1)))
        elif kind == "traffic":
            for server, span, wait, nbytes in e.get("servers", []):
                if span > 0 and wait > 0 and nbytes > 0:
                    upper.setdefault(int(server), []).append((int(e["clock"]), nbytes / wait))
        elif (
            kind == "member"
            and e.get("role") == "server"
            and e.get("state") == "joined"
            and int(e.get("rank", -1)) >= servers
            and join is None
        ):
            join = reported
    return None if join is None else figures(upper, join, servers, slow)


def from_trace(trace: Trace, servers: int, slow: int | None) -> dict[str, Any] | None:
    """:func:`figures` of a simulated run (its ``bounds`` and their ``bound_clocks``;
    the join at its first ``server_joined`` decision's step). None as
    :func:`from_record`. Pure."""
    joins = [d.clock for d in trace.decisions if d.kind == "server_joined"]
    if slow is None or not joins:
        return None
    upper = {
        server: [
            (step, b[1]) for step, b in zip(trace.bound_clocks.get(server, []), row, strict=False)
        ]
        for server, row in trace.bounds.items()
    }
    return figures(upper, joins[0] - 1, servers, slow)
