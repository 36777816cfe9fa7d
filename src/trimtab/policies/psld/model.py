"""PSLD's model: what each server's chunks cost it per step, and the plans that move
chunks from the server predicted slowest to where they finish soonest (pure functions).

A server's predicted time per step is the bytes it handles per step over its measured
speed (bytes per busy second, :mod:`trimtab.policies.psld.speeds`). Nothing here does
I/O, keeps state or reads a clock.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from trimtab.errors import ConfigError

#: The floor of a speed in a division: a server measured at 0 bytes/s (or not at all,
#: filled with 0) is predicted very slow rather than dividing by zero.
MIN_SPEED = 1e-12


def seconds(nbytes: float, speed: float) -> float:
    """Predicted seconds a server of ``speed`` bytes/s needs for ``nbytes``."""
    return nbytes / max(speed, MIN_SPEED)


def server_times(
    sizes: Sequence[int], owners: Sequence[int], speeds: Sequence[float]
) -> list[float]:
    """Predicted seconds each server needs per step for the bytes it owns."""
    load = [0.0] * len(speeds)
    for size, owner in zip(sizes, owners, strict=True):
        load[owner] += size
    return [seconds(b, v) for b, v in zip(load, speeds, strict=True)]


def slowest(times: Sequence[float]) -> int:
    """The index of the largest of ``times`` (the server predicted slowest)."""
    return max(range(len(times)), key=times.__getitem__)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A proposed placement and what it is predicted to do.

    Attributes:
        owners: the new owner of every chunk.
        moved_bytes: bytes that change servers.
        before_s / after_s: the slowest server's predicted time per step, now and after.
        cost_s: predicted time the migration itself takes.
    """

    owners: tuple[int, ...]
    moved_bytes: int
    before_s: float
    after_s: float
    cost_s: float

    @property
    def gain_s(self) -> float:
        """Predicted seconds saved per step."""
        return self.before_s - self.after_s


def rebalance(
    sizes: Sequence[int],
    owners: Sequence[int],
    speeds: Sequence[float],
    *,
    active: Sequence[bool] | None = None,
    max_moves: int | None = None,
    probe: frozenset[int] = frozenset(),
) -> Plan:
    """Best-fit moves from the slowest server to where each chunk finishes soonest.

    ``sizes[c]`` is what chunk ``c`` costs its server per step (bytes), ``speeds[s]``
    server ``s``'s measured bytes per second. Servers with ``active[s]`` False (being
    drained) receive nothing and give away everything. Pure; returns a plan with no
    moves when nothing helps; raises :class:`ConfigError` if no server is active.
    Servers in ``probe`` (speed unknown: new, or idle for long) receive at most one
    chunk: their speed is measured on it before they are trusted with more. A server
    carrying less than half the median load of the loaded servers is filled up to that
    median at most: its speed was measured on a light load, which passes in bursts and hides
    queueing, and says little about many times that load; the next plan, made with its
    speed measured at the median, may give it more.
    """
    n = len(speeds)
    active = [True] * n if active is None else list(active)
    new = list(owners)
    load = [0.0] * n
    for size, owner in zip(sizes, new, strict=True):
        load[owner] += size

    def t(s: int) -> float:
        return seconds(load[s], speeds[s])

    targets = [s for s in range(n) if active[s]]
    if not targets:
        raise ConfigError("rebalance needs at least one active server")
    # Draining servers first: everything they own must go.
    for c, owner in enumerate(new):
        if not active[owner]:
            dest = min(targets, key=lambda s: seconds(load[s] + sizes[c], speeds[s]))
            load[owner] -= sizes[c]
            load[dest] += sizes[c]
            new[c] = dest
    before = max(server_times(sizes, owners, speeds))
    carried = sorted(load[s] for s in targets if load[s] > 0)
    typical = statistics.median(carried) if carried else float("inf")
    cap = [typical if load[s] < typical / 2 else float("inf") for s in range(n)]
    received = [0] * n
    for o in new:
        if o in probe:
            received[o] += 1  # a probed server that owns something is measured already
    moves = 0
    while max_moves is None or moves < max_moves:
        # Lower the slowest server's time; the receiver must end below where the
        # slowest was. Each move makes the sorted times smaller, so this ends.
        worst = max(targets + [s for s in range(n) if not active[s]], key=t)
        current = t(worst)
        best: tuple[float, int, int] | None = None
        for c in (c for c, o in enumerate(new) if o == worst):
            for dest in targets:
                if dest == worst or (dest in probe and received[dest]):
                    continue
                if load[dest] + sizes[c] > cap[dest]:
                    continue
                after = max(
                    seconds(load[worst] - sizes[c], speeds[worst]),
                    seconds(load[dest] + sizes[c], speeds[dest]),
                )
                if after < current * (1 - 1e-9) and (best is None or after < best[0]):
                    best = (after, c, dest)
        if best is None:
            break
        _, c, dest = best
        received[dest] += 1
        load[worst] -= sizes[c]
        load[dest] += sizes[c]
        new[c] = dest
        moves += 1
    new = list(fewest_moves(sizes, owners, new))
    moved = [c for c in range(len(new)) if new[c] != owners[c]]
    cost = sum(
        seconds(sizes[c], speeds[owners[c]]) + seconds(sizes[c], speeds[new[c]]) for c in moved
    )
    return Plan(
        owners=tuple(new),
        moved_bytes=sum(sizes[c] for c in moved),
        before_s=before,
        after_s=max(server_times(sizes, new, speeds)),
        cost_s=cost,
    )


def fewest_moves(
    sizes: Sequence[int], owners: Sequence[int], new: Sequence[int]
) -> tuple[int, ...]:
    """A map that gives every server the chunks ``new`` gives it, counted by cost
    (each server's chunks of each size in ``sizes``), in the fewest moves from
    ``owners``, the same whichever way ``new`` was reached. Pure.

    Every server's load per size is ``new``'s, so every predicted time is. Of each
    size, a server with fewer such chunks in ``new`` than in ``owners`` gives its
    lowest-numbered ones (those :func:`rebalance`'s search takes first), and they go to
    the servers with more, in server order. Why: :func:`rebalance` moves from whichever
    server is slowest at each turn, so a server that has just received chunks may
    become it and pass some of its own on; on the test bed (issue 38) a plan moved two
    chunks off a fast server and four onto it, 8 moves where 6 reach the same loads, and
    which of the 6, 7 or 8 move plans came out followed the scatter of one step's
    figures (a slow server at 4.4 to 5 times slower than the others' gave the 8).
    """
    out = list(owners)
    by_size: dict[int, list[int]] = {}
    for c, size in enumerate(sizes):
        by_size.setdefault(size, []).append(c)
    for chunks in by_size.values():
        wanted: dict[int, int] = {}
        for c in chunks:
            wanted[new[c]] = wanted.get(new[c], 0) + 1
            wanted[owners[c]] = wanted.get(owners[c], 0) - 1
        leaving: list[int] = []
        for c in chunks:  # in chunk order: each giver's lowest-numbered first
            if wanted[owners[c]] < 0:
                wanted[owners[c]] += 1
                leaving.append(c)
        takers = [s for s in sorted(wanted) for _ in range(max(0, wanted[s]))]
        for c, dest in zip(leaving, takers, strict=True):
            out[c] = dest
    return tuple(out)


def explore_move(
    sizes: Sequence[int],
    owners: Sequence[int],
    speeds: Sequence[float],
    *,
    active: Sequence[bool] | None = None,
    slack: float = 0.05,
) -> tuple[int, ...] | None:
    """One chunk from the server predicted slowest to the least loaded active server,
    if that server carries less than the median load and the slowest predicted time
    after the move is within ``slack`` of now (a move the measurements cannot rule
    out); else None. Pure.

    The least loaded server is the one whose speed figure is least certain: it was
    measured on a light load, which passes in bursts. Of the slowest server's chunks the
    smallest moves (the least risk)."""
    n = len(speeds)
    live = [True] * n if active is None else list(active)
    times = server_times(sizes, owners, speeds)
    worst = slowest(times)
    load = [t * max(v, MIN_SPEED) for t, v in zip(times, speeds, strict=True)]
    others = [s for s in range(n) if live[s] and s != worst]
    mine = [c for c, o in enumerate(owners) if o == worst]
    if not others or not mine:
        return None
    dest = min(others, key=lambda s: (load[s], s))
    carried = [load[s] for s in range(n) if live[s] and load[s] > 0]
    if carried and load[dest] >= statistics.median(carried):
        return None  # no lightly loaded server: every figure was measured under load
    c = min(mine, key=lambda c: (sizes[c], c))
    after = list(times)
    after[worst] = seconds(load[worst] - sizes[c], speeds[worst])
    after[dest] = seconds(load[dest] + sizes[c], speeds[dest])
    if max(after) > times[worst] * (1 + slack):
        return None
    new = list(owners)
    new[c] = dest
    return tuple(new)


def drain_move(
    sizes: Sequence[int],
    owners: Sequence[int],
    speeds: Sequence[float],
    *,
    active: Sequence[bool] | None = None,
    slack: float = 0.05,
) -> tuple[int, ...] | None:
    """Every chunk off the slowest active server (the lowest speed), if the other
    active servers are predicted to carry its load with the slowest time within
    ``slack`` of now; else None. Pure.

    One fewer server is worth trying when the model says the step stays as fast: the
    server can then be given back. Its chunks go where :func:`rebalance` puts a
    draining server's."""
    n = len(speeds)
    live = [True] * n if active is None else list(active)
    candidates = [s for s in range(n) if live[s]]
    if len(candidates) < 2:
        return None
    victim = min(candidates, key=lambda s: (speeds[s], -s))
    if victim not in owners:
        return None  # it carries nothing already: nothing to try, only to retire
    without = [live[s] and s != victim for s in range(n)]
    plan = rebalance(sizes, owners, speeds, active=without)
    now = max(server_times(sizes, owners, speeds))
    after = max(server_times(sizes, plan.owners, speeds))
    if victim in plan.owners or after > now * (1 + slack):
        return None
    return plan.owners


def chunk_costs(sizes: Mapping[int, int] | Sequence[int], workers: int) -> list[int]:
    """Bytes a chunk costs its server per step: every worker's push and reply."""
    values = list(sizes.values()) if isinstance(sizes, Mapping) else list(sizes)
    return [2 * workers * b for b in values]
