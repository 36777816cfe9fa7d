"""One job of ``trimtab experiment faults`` or ``soak``, run and judged from the outside.

:func:`run_job` starts ``trimtab run`` (2 workers and 3 servers by default, BSP) with
the given ``--fault`` specs and flags, on the worker script
:mod:`~trimtab_tools.experiments._faults_worker`, and watches it as a user would: its
output (the victims' marker lines, the launcher's notes), the workers' sample logs, and
the processes it started (found by a tag in their environment, so also those its
launcher lost). It stops the job if no step completes for ``stall_s`` (a hang) or at
``stop_at``. :func:`judge` turns what was seen into the figures: ``faults_injected``,
``lost_updates``, ``equivalent`` (with ``max_diff``), ``recovery_s``,
``leaked_processes``, the step time; and, where the job did not finish, why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from trimtab.faults.kills import read_marker
from trimtab_tools.experiments import samples

#: The environment variable that marks every process of one experiment job.
TAG = "TRIMTAB_EXPERIMENT_TAG"


@dataclasses.dataclass
class Seen:
    """What one job showed."""

    status: int | None = None
    lines: list[str] = dataclasses.field(default_factory=list)
    markers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    hung: bool = False
    stopped: bool = False
    wall_s: float = 0.0
    rss_mb: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    leaked: list[str] = dataclasses.field(default_factory=list)
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    final: dict[str, Any] | None = None


def tagged_processes(tag: str) -> list[int]:
    """Pids of live processes whose environment holds ``TAG=tag`` (this user's)."""
    needle = f"{TAG}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue  # gone, or another user's
    return pids


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def run_job(
    steps: int,
    faults: list[str],
    flags: list[str],
    *,
    workers: int = 2,
    servers: int = 3,
    pause_s: float = 0.0,
    hidden: int = 64,
    stall_s: float = 20.0,
    stop_at: float | None = None,
    deadline_s: float = 300.0,
) -> Seen:
    """Run one job to its end (or stop it: a stall of ``stall_s`` without a completed
    step once one completed, or the monotonic time ``stop_at``). Blocks."""
    tag = uuid.uuid4().hex
    seen = Seen()
    with tempfile.TemporaryDirectory(prefix="trimtab-faults-") as tmp:
        out = Path(tmp)
        argv = [
            sys.executable,
            "-m",
            "trimtab",
            "run",
            "-w",
            str(workers),
            "-s",
            str(servers),
            *[f"--fault={f}" for f in faults],
            *flags,
            "--deadline",
            str(deadline_s),
            "--",
            sys.executable,
            "-m",
            "trimtab_tools.experiments._faults_worker",
            str(out),
            str(steps),
            str(pause_s),
            str(hidden),
        ]
        env = {**os.environ, TAG: tag}
        started = time.monotonic()
        job = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        reader = threading.Thread(target=_read, args=(job, seen), daemon=True)
        reader.start()
        last_count, last_progress, next_rss = 0, time.monotonic(), 0.0
        while job.poll() is None:
            now = time.monotonic()
            if now >= next_rss:
                seen.rss_mb.append(
                    (round(now - started, 1), round(_rss_mb(tagged_processes(tag)), 1))
                )
                next_rss = now + 1.0
            count = sum(1 for r in samples.read_logs(out) if "done" in r)
            if count != last_count:
                last_count, last_progress = count, now
            elif count and now - last_progress > stall_s:
                seen.hung = True
            if seen.hung or (stop_at is not None and now >= stop_at):
                seen.stopped = not seen.hung
                os.kill(job.pid, signal.SIGTERM)  # the launcher stops every process
                try:
                    job.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(job.pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        seen.status = job.wait()
        seen.wall_s = time.monotonic() - started
        reader.join(timeout=5)
        time.sleep(0.5)  # what the launcher stopped has had time to go
        leaked = tagged_processes(tag)
        seen.leaked = [_cmdline(pid) for pid in leaked]
        for pid in leaked:  # found, counted, and ended: the experiment leaves nothing
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        seen.records = samples.read_logs(out)
        final = out / "final.json"
        seen.final = json.loads(final.read_text()) if final.exists() else None
    return seen


def _read(job: subprocess.Popen[bytes], seen: Seen) -> None:
    assert job.stdout is not None
    for raw in iter(job.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        seen.lines.append(line)
        body = read_marker(line)
        if body is not None:
            seen.markers.append(body)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"pid {pid}"


def judge(seen: Seen, steps: int, hidden: int = 64) -> dict[str, Any]:
    """The figures of one job (see the module). Never raises for a failed job: its
    figures say what could not be known, and ``reason`` why."""
    applied_undone = [
        (int(m["pid"]), int(m["step"]))
        for m in seen.markers
        if m.get("role") == "worker" and m.get("phase") == "after-reply"
    ]
    mid_push = [m for m in seen.markers if m.get("phase") == "mid-push"]
    final = seen.final
    completed = final is not None and final["clock"] >= steps
    out: dict[str, Any] = {
        "status": seen.status,
        "completed": completed,
        "steps": steps,
        "faults_injected": len(seen.markers),
        "faults": [m["spec"] for m in seen.markers],
        "hung": seen.hung,
        "leaked_processes": len(seen.leaked),
        "wall_s": round(seen.wall_s, 1),
    }
    if seen.leaked:
        out["leaked"] = seen.leaked
    times = samples.done_times(seen.records)
    out["recovery_s"] = [
        round(next((t for t in times if t > m["at"]), float("nan")) - m["at"], 3)
        for m in seen.markers
    ]
    if any(v != v for v in out["recovery_s"]):  # NaN: no step completed after that kill
        out["recovery_s"] = [None if v != v else v for v in out["recovery_s"]]
    out["step_s"] = median_step_s(seen.records)
    out["longest_step_s"] = longest_step_s(seen.records)
    # Per coordinator death: how long worker 0 waited for its replacement's REJOINED.
    out["rejoined_s"] = [
        float(line.split("took over after ")[1].split("s")[0])
        for line in seen.lines
        if line.startswith("[worker 0]") and "a new coordinator took over after" in line
    ]
    if final is None:
        out.update(lost_updates=None, equivalent=False, max_diff=None)
        out["reason"] = reason(seen)
        return out
    chunks = int(final["chunks"])
    versions = {int(c): int(v) for c, v in final["versions"].items()}
    clock = int(final["clock"])
    out["lost_updates"] = sum(max(0, clock - versions.get(c, 0)) for c in range(chunks))
    reference = samples.reference(samples.processed(seen.records, applied_undone), hidden)
    diff = max(
        (torch.tensor(p) - r.flatten()).abs().max().item()
        for p, r in zip(final["params"], reference, strict=True)
    )
    out["max_diff"] = diff
    out["equivalent"] = diff <= 1e-5
    if mid_push:
        out["note"] = (
            "a worker died mid-push: its step's gradient reached some chunks only; the "
            "reference counts it nowhere"
        )
    if not completed:
        out["reason"] = reason(seen)
    return out


def median_step_s(records: list[dict[str, Any]]) -> float | None:
    """The median time between consecutive steps rank 0 finished (None if < 2)."""
    mine = sorted(float(r["done"]) for r in records if "done" in r and r["rank"] == 0)
    gaps = [b - a for a, b in itertools.pairwise(mine)]
    return round(statistics.median(gaps), 4) if gaps else None


def longest_step_s(records: list[dict[str, Any]]) -> float | None:
    """The longest time between consecutive steps rank 0 finished (None if < 2)."""
    mine = sorted(float(r["done"]) for r in records if "done" in r and r["rank"] == 0)
    gaps = [b - a for a, b in itertools.pairwise(mine)]
    return round(max(gaps), 4) if gaps else None


def reason(seen: Seen) -> str:
    """Why a job did not finish, in the job's own words where it said so."""
    if seen.hung:
        return "hung: no step completed for the stall limit; stopped"
    if seen.stopped:
        return "stopped at the end of the experiment's time"
    for key in ("JobAborted", "job aborted", "exited with status", "ran past its deadline"):
        found = [line for line in seen.lines if key in line]
        if found:
            return found[0][-300:]
    said = [line for line in seen.lines if line.startswith(("trimtab:", "[trimtab]"))]
    if said:  # the launcher's own word (e.g. flags it refused)
        return said[-1][-300:]
    return f"trimtab run exited with status {seen.status}"
