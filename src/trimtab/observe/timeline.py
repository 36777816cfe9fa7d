"""``--trace DIR``: the coordinator's own trace, and every process's merged into one.

Each process of a traced job writes ``DIR/<process>.json`` (:mod:`trimtab.runtime.trace`):
a worker its pushes and the values it read, per chunk; a server each push's merge,
each round's update and each reply, per chunk; the coordinator (:class:`CoordinatorTrace`)
an instant per event of its stream (step reports, load reports, placements,
migrations...), a row per kind. :func:`merge` puts them in one file, ``DIR/trace.json``,
in BytePS' shape: a process per role (coordinator, server 0, ..., worker 0, ...), a
row per chunk, every event on the coordinator's clock. The launcher merges at the
job's end; ``trimtab report --trace DIR`` merges again.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.roles.coordinator.events import KINDS, Event
from trimtab.runtime.trace import Trace

#: The merged file, beside the processes' own.
MERGED = "trace.json"
#: The coordinator's rows: one per kind of event.
KIND_ROWS = {kind: row for row, kind in enumerate(KINDS)}


class CoordinatorTrace:
    """A listener of the coordinator's events (:class:`~trimtab.roles.coordinator.events.Events`)
    marking each on ``trace`` at its own time ``t``, with its fields as arguments.
    Thread-safe (emitting threads may call it at once); never blocks long."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        trace.rows.update({row: kind for kind, row in KIND_ROWS.items()})
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        kind = event["kind"]
        args = {k: v for k, v in event.items() if k not in ("t", "kind")}
        with self._lock:
            self.trace.instant_at(kind, KIND_ROWS.get(kind, len(KIND_ROWS)), event["t"], args)


def _order(name: str) -> tuple[int, int, str]:
    """Coordinator first, then servers, then workers, each by number."""
    role, _, number = name.partition("-")
    rank = int(number) if number.isdigit() else -1
    return ({"coordinator": 0, "server": 1, "worker": 2}.get(role, 3), rank, name)


def merge(directory: str | os.PathLike[str]) -> Path:
    """Merge every process's trace file in ``directory`` into ``directory/trace.json``
    and return its path. Each process becomes a ``pid`` (1 the coordinator, then the
    servers, then the workers), named by metadata events, its rows named (``chunk 3``,
    or the coordinator's kinds); each event's ``ts`` gets its process's clock
    correction (``otherData.trimtab.correction_s``: to the coordinator's clock).
    ``otherData.trimtab.processes`` keeps each process's clock sync and counts.
    Blocks on the files; raises ``OSError``, and ``ValueError`` for a file that is not
    a trimtab trace or a directory with none."""
    root = Path(directory)
    files = [p for p in root.glob("*.json") if p.name != MERGED and not p.name.endswith(".tmp")]
    if not files:
        raise ValueError(f"no trace files in {root} (a job run with --trace {root} writes them)")
    loaded = []
    for path in files:
        data = json.loads(path.read_text())
        meta = data.get("otherData", {}).get("trimtab") if isinstance(data, dict) else None
        if not isinstance(meta, dict) or not isinstance(data.get("traceEvents"), list):
            raise ValueError(f"{path} is not a trimtab trace file")
        loaded.append((_order(str(meta["process"])), meta, data["traceEvents"]))
    loaded.sort(key=lambda item: item[0])
    events: list[dict[str, Any]] = []
    processes = []
    for pid, (_, meta, own) in enumerate(loaded, start=1):
        name = str(meta["process"])
        shift = float(meta.get("correction_s") or 0.0) * 1e6
        events.append(_meta("process_name", pid, 0, {"name": name}))
        events.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
        rows = {int(k): v for k, v in meta.get("rows", {}).items()}
        for tid in sorted({int(e["tid"]) for e in own}):
            label = rows.get(tid, f"chunk {tid}")
            events.append(_meta("thread_name", pid, tid, {"name": label}))
            events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        for e in own:
            events.append({**e, "pid": pid, "ts": e["ts"] + shift})
        processes.append({**meta, "merged_pid": pid})
    out = root / MERGED
    tmp = out.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps(
            {
                "traceEvents": events,
                "displayTimeUnit": "ms",
                "otherData": {"trimtab": {"clock": "coordinator", "processes": processes}},
            }
        )
    )
    tmp.replace(out)
    return out


def summary(path: Path) -> str:
    """One line about the merged trace ``path``: processes, events, dropped, clocks."""
    meta = json.loads(path.read_text())["otherData"]["trimtab"]["processes"]
    dropped = sum(int(p.get("dropped", 0)) for p in meta)
    worst = max((abs(float(p.get("correction_s") or 0.0)) for p in meta), default=0.0)
    return (
        f"trace: {path} ({len(meta)} processes, {sum(int(p['events']) for p in meta)} events"
        + (f", {dropped} dropped at the cap" if dropped else "")
        + f", largest clock correction {worst * 1e3:.3f} ms; open in https://ui.perfetto.dev)"
    )


_OWN = re.compile(r"(coordinator|server(-\d+)?|worker-\d+|trace)\.json")


def prepare(directory: str | os.PathLike[str]) -> Path:
    """Make ``directory`` (absolute) for a job's trace and remove the trace files of an
    earlier one there (``coordinator.json``, ``server-N.json``, ``worker-N.json``,
    ``trace.json``; nothing else), which would be merged in. Raises
    :class:`ConfigError` where it cannot."""
    root = Path(directory).resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
        for path in root.iterdir():
            if _OWN.fullmatch(path.name):
                path.unlink()
    except OSError as exc:
        raise ConfigError(f"--trace {directory}: {exc}") from None
    return root


def merged(directory: str | os.PathLike[str]) -> str:
    """:func:`merge` for the launcher at a job's end: the line to print, saying where
    the trace is or why there is none. Never raises."""
    try:
        return summary(merge(directory))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"trace: not merged: {exc}"


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


__all__ = ["KIND_ROWS", "MERGED", "CoordinatorTrace", "merge", "merged", "prepare", "summary"]
