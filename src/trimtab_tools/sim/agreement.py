"""Whether a simulated run made the same decisions as a measured one (``validate-sim``).

"The same decisions" in the first :data:`FIRST` steps, precisely:

* **maps** (PSLD): the steps after which the map the workers route by changed, each
  with its moves ``[chunk, from, to]``. They agree when both runs changed the map as
  often, each change of one within :data:`STEP_SLACK` step of the other's (a worker's
  report races the coordinator's step boundary), with the same moves: every chunk
  from the same server to the same server.
* **batches** (LB-BSP): the straggler's batch size at each step (the straggler
  decision: how much of the global batch the slow worker is given). They agree when,
  at every step, the sizes differ by at most :data:`BATCH_SLACK` samples or
  :data:`BATCH_SHARE` of the measured size, whichever is more (the sizes are split to
  the sample from speeds measured to a few percent), each series taken as its running
  median of three from the first decided step (:data:`DECIDED`; :func:`settled`): a
  single step's size beyond both its neighbours is one noisy speed sample answered
  (the next step's sizes undo it), a draw of the machine's noise at that step that no
  simulation reproduces at the same step (one that drew a worker's noise would put its
  own outliers at other steps); a size that differs two steps running, or a level
  that differs, still fails. :func:`batches_agree` with ``settle=False`` is the rule
  without it (``decisions_match_every_step``). Every worker's sizes are compared by
  the same rule too, and reported beside it (the fast workers' sizes also follow their
  own noise, which a model of their median speeds does not have).

Pure functions, and one that reads a run record's events (:func:`record_facts`).
"""

from __future__ import annotations

import collections
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BATCH_SHARE",
    "BATCH_SLACK",
    "DECIDED",
    "FIRST",
    "STEP_SLACK",
    "batches_agree",
    "held_epochs",
    "map_changes",
    "maps_agree",
    "record_events",
    "record_facts",
    "settled",
]

#: Steps whose decisions are compared.
FIRST = 20
#: Steps by which a map change may come earlier or later and still be the same.
STEP_SLACK = 1
#: Samples, and share of the measured size, by which a batch may differ.
BATCH_SLACK, BATCH_SHARE = 2, 0.1
#: The first step whose sizes LB-BSP decided (from step 0's reports: they hold from
#: step 2); the steps before are the equal split.
DECIDED = 2


def map_changes(
    epochs: Sequence[int], maps: Mapping[int, Sequence[int]], first: int = FIRST
) -> list[dict[str, Any]]:
    """The steps (within ``first``) after which the map changed: ``epochs[i]`` is the
    epoch of the map routed by after step ``i``, ``maps`` each epoch's owners. Each
    change: ``{"step": i, "moves": [[chunk, from, to], ...]}`` (moves None where a map
    is unknown). Pure."""
    out: list[dict[str, Any]] = []
    for i in range(1, min(first, len(epochs))):
        if epochs[i] == epochs[i - 1]:
            continue
        old, new = maps.get(epochs[i - 1]), maps.get(epochs[i])
        moves = (
            [[c, a, b] for c, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
            if old is not None and new is not None and len(old) == len(new)
            else None
        )
        out.append({"step": i, "moves": moves})
    return out


def held_epochs(epochs: Sequence[int], learned: Mapping[int, int]) -> list[int]:
    """A simulated run's map epochs as a real worker records them (the bed's
    ``epochs``: the epoch of the map it routes by when each step ends): ``epochs[i]``
    the map in force at step ``i``, or the one ``learned[i]`` names where the workers
    learned a new map during step ``i`` (a migration cut at its round: its pushes
    answered *moved*, the worker fetches the map at once). Pure.

    A map decided during step ``k`` (on step ``k - 1``'s reports) is in force from step
    ``k + 1``: a worker adopts it at that step's first push, so its record shows the
    change at step ``k + 1``, or at ``k`` where the migration was cut at ``k``'s round.
    (Until issue 38's sixth round validate-sim read ``epochs[i + 1]`` for step ``i``,
    a step before the bed's record of the same decision.)"""
    return [max(e, learned.get(i, e)) for i, e in enumerate(epochs)]


def maps_agree(measured: list[dict[str, Any]], simulated: list[dict[str, Any]]) -> bool:
    """Whether two runs' :func:`map_changes` are the same decisions (module docstring).
    Pure."""
    if len(measured) != len(simulated):
        return False
    for m, s in zip(measured, simulated, strict=True):
        if abs(m["step"] - s["step"]) > STEP_SLACK or m["moves"] is None:
            return False
        if sorted(map(tuple, m["moves"])) != sorted(map(tuple, s["moves"] or [])):
            return False
    return True


def settled(sizes: Sequence[int], start: int = DECIDED) -> list[float]:
    """``sizes`` with each step from ``start`` on, but the last, replaced by the median
    of it and its two neighbours, the neighbours taken from ``start`` on: a single
    step's outlier gives way, a change that lasts two steps stays. Pure."""
    out = [float(x) for x in sizes]
    for i in range(start + 1, len(sizes) - 1):
        out[i] = float(sorted(sizes[i - 1 : i + 2])[1])
    return out


def batches_agree(
    measured: Sequence[Sequence[int]], simulated: Sequence[Sequence[int]], settle: bool = True
) -> bool:
    """Whether two runs' batch sizes (per worker, per step: ``sizes[rank][step]``) are
    the same decisions over the steps both have (module docstring; ``settle``: each
    series :func:`settled` first). Pure."""
    if len(measured) != len(simulated):
        return False
    for real, sim in zip(measured, simulated, strict=True):
        n = min(len(real), len(sim))
        pairs = (
            zip(settled(real[:n]), settled(sim[:n]), strict=True)
            if settle
            else zip(map(float, real[:n]), map(float, sim[:n]), strict=True)
        )
        for a, b in pairs:
            if abs(a - b) > max(BATCH_SLACK, BATCH_SHARE * a):
                return False
    return True


def record_events(record: str | Path | None) -> list[dict[str, Any]]:
    """The events of a run record (``runs/<job>/events.jsonl``), lines that are not
    JSON objects left out. Blocks (reads a file); an absent or unreadable record gives
    ``[]``."""
    if record is None:
        return []
    try:
        lines = (Path(record) / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict):
            events.append(e)
    return events


def record_facts(record: str | Path | None, servers: int) -> dict[str, Any]:
    """What a run record (``runs/<job>/events.jsonl``) says of a PSLD run: ``maps``
    (epoch -> owners, keys as strings, as JSON keeps them), ``join_s`` (seconds from
    the first server wanted to its joining; None if none joined), ``join_steps`` (the
    job's steps reported between the two: the last step any worker had reported at
    each), ``addrs`` (each server's address, from its ``member`` events; keys as
    strings), ``slow_server`` (of the first ``servers``, the one the coordinator
    named a straggler most often; None if none) and ``decision_s`` (the median, over
    the migrations PSLD started, of the seconds from the last worker's report before
    each to its start event; None if none). Blocks (reads a file); an absent or
    unreadable record gives ``{}``."""
    events = record_events(record)
    if not events:
        return {}
    maps: dict[str, list[int]] = {}
    addrs: dict[str, str] = {}
    wanted: float | None = None
    joined: float | None = None
    clock, wanted_clock, joined_clock = -1, -1, -1
    named: collections.Counter[int] = collections.Counter()
    last_report: float | None = None
    delays: list[float] = []
    for e in events:
        kind = e.get("kind")
        if kind == "step":
            clock = max(clock, int(e.get("clock", -1)))
            last_report = float(e["t"]) if "t" in e else None
        elif kind == "migration" and e.get("phase") == "start" and last_report is not None:
            delays.append(float(e["t"]) - last_report)
        elif kind == "member" and e.get("role") == "server" and e.get("addr"):
            addrs[str(e["rank"])] = str(e["addr"])
        if kind == "placement" and "owners" in e:
            maps[str(e["epoch"])] = list(e["owners"])
        elif kind == "servers_wanted" and wanted is None:
            wanted, wanted_clock = float(e["t"]), clock
        elif (
            kind == "member"
            and e.get("role") == "server"
            and e.get("state") == "joined"
            and e.get("rank", 0) >= servers
            and wanted is not None
            and joined is None
        ):
            joined, joined_clock = float(e["t"]), clock
        elif kind == "straggler" and e.get("role") == "server" and e.get("rank", servers) < servers:
            named[int(e["rank"])] += 1
    join = None if wanted is None or joined is None else joined - wanted
    return {
        "maps": maps,
        "addrs": addrs,
        "join_s": None if join is None else round(join, 3),
        "join_steps": None if join is None else joined_clock - wanted_clock,
        "slow_server": named.most_common(1)[0][0] if named else None,
        "decision_s": round(statistics.median(delays), 4) if delays else None,
    }
