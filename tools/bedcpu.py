"""Where the CPU of a bed step goes: trimtab against the lean PS, by role and thread.

    tools/bedcpu.py [--order trimtab,lean,trimtab,lean] [--steps 80] [--perf] [--json OUT]

Runs ``bench datapath --testbed``'s 100 MiB job (2 workers x 2 servers, each on a host
of one test bed) and the lean PS (:mod:`trimtab_tools.bench.baselines.leanps`) on the
same hosts, in the order given, and for each run measures, over a window of
:data:`WINDOW_S` in its steady state:

* every thread's CPU (``/proc/PID/task/TID/schedstat``: user and kernel, in ns), its
  voluntary and involuntary context switches, by role and thread kind (the Python main
  thread, ZeroMQ's I/O thread, pyzmq's garbage-collector thread for zero-copy sends,
  trimtab's own threads), in ms a step;
* with ``--perf``, in a second window, ``perf record -a -e cpu-clock`` (999 Hz): each
  role's and thread kind's samples by shared object (the interpreter, torch's kernels,
  the kernel, libzmq), so "Python" and "copying bytes" can be told apart.

A step is counted by bytes, not by time: worker 0's host's interface moves a fixed number
of bytes a step (measured over the whole run), so the CPU a step is right whatever the
machine's speed in the window. Needs root (the bed), ``py-spy`` (thread names) and, for
``--perf``, ``perf``. Blocks for the runs (about 30 s each); prints a table, and the
raw figures as JSON with ``--json``. A measuring tool, not a benchmark: run it under
the benchmark lock, and compare runs of one sitting only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trimtab.launch.hosts import place
from trimtab_tools.bench.baselines import leanps
from trimtab_tools.bench.bed import shaped_bed
from trimtab_tools.bench.datapath import model_sizes
from trimtab_tools.bench.job import run_trimtab

WINDOW_S = 3.0
SAMPLE_S = 0.1
WARMUP = 3
#: Steps' worth of bytes after which the job is taken to be steady.
STEADY_STEPS = 8
_PERF = ["perf", "record", "-q", "-a", "-e", "cpu-clock", "-F", "999"]

Threads = dict[int, tuple[str, int, int, int, int]]  # tid -> (comm, ns, user, vcs, nvcs)


def role_of(cmd: str) -> str | None:
    """The role a process of either job plays, from its command line."""
    if "leanps" in cmd:
        return "server" if " server " in cmd else "worker"
    if "_datapath_worker" in cmd:
        return "worker"
    if "trimtab" in cmd and " server" in cmd:
        return "server"
    if "trimtab" in cmd and "coordinator" in cmd:
        return "coordinator"
    return None


def job_processes() -> dict[int, str]:
    """pid -> role of the jobs' processes now running."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        role = role_of(cmd) if "python" in cmd and "bedcpu" not in cmd else None
        if role:
            found[int(entry)] = role
    return found


def threads(pid: int) -> Threads:
    """Every thread's name, CPU (ns), user ticks and context switches."""
    out: Threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            stat = Path(f"{base}/stat").read_text()
            status = Path(f"{base}/status").read_text()
            ns = int(Path(f"{base}/schedstat").read_text().split()[0])
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        user = int(stat[stat.rindex(")") + 2 :].split()[11])
        vcs = re.search(r"\nvoluntary_ctxt_switches:\s+(\d+)", status)
        nvcs = re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", status)
        out[int(tid)] = (
            comm,
            ns,
            user,
            int(vcs.group(1)) if vcs else 0,
            int(nvcs.group(1)) if nvcs else 0,
        )
    return out


def host_bytes(pid: int) -> int | None:
    """Bytes in and out of ``pid``'s network namespace (its bed host), ``lo`` aside."""
    try:
        lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    except OSError:
        return None
    total = 0
    for line in lines:
        name, rest = line.split(":", 1)
        if name.strip() != "lo":
            fields = rest.split()
            total += int(fields[0]) + int(fields[8])
    return total


def python_names(pid: int) -> dict[int, str]:
    """Python threads' names by native id (``py-spy dump``); empty without py-spy."""
    try:
        text = subprocess.run(
            ["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]*)"', text):
        names[int(m.group(1))] = m.group(2)
    return names


def kind_of(name: str) -> str:
    """A thread's kind, the same name for both jobs."""
    if name.startswith("ZMQbg/IO"):
        return "zmq-io"
    if name.startswith("ZMQbg/Reaper"):
        return "zmq-reaper"
    if name == "Thread-1":  # pyzmq's garbage collector of zero-copy frames
        return "pyzmq-gc"
    if name == "python":  # a native thread of the interpreter's (torch's pool)
        return "native"
    return name


class Sampler(threading.Thread):
    """Samples the jobs' threads and worker 0's host bytes every :data:`SAMPLE_S`."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, int | None, dict[int, Threads]]] = []
        self.roles: dict[int, str] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            now = time.monotonic()
            procs = job_processes()
            self.roles.update(procs)
            workers = sorted(p for p, r in procs.items() if r == "worker")
            moved = host_bytes(workers[0]) if workers else None
            self.samples.append((now, moved, {pid: threads(pid) for pid in procs}))
            self.stopped.wait(SAMPLE_S)


def _steady_then_windows(sampler: Sampler, perf: Path | None, marks: dict[str, Any]) -> None:
    """Wait for the steady state, then the CPU window, then (``perf``) perf's."""
    base = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        moved = sampler.samples[-1][1] if sampler.samples else None
        if moved is not None:
            base = moved if base is None else base
            if moved - base > STEADY_STEPS * 2 * 100 * 2**20:
                break
        time.sleep(0.05)
    marks["cpu"] = (time.monotonic(), time.monotonic() + WINDOW_S)
    time.sleep(WINDOW_S)
    if perf is not None:
        subprocess.run(
            [*_PERF, "-o", str(perf), "--", "sleep", str(WINDOW_S)],
            capture_output=True,
        )
        end = time.monotonic()  # (perf's own start-up left out of the window)
        marks["perf"] = (end - WINDOW_S, end)
    marks["names"] = {pid: python_names(pid) for pid in list(sampler.roles)}


def run_one(kind: str, bed: Any, steps: int, perf: Path | None) -> dict[str, Any]:
    """One run of ``kind`` (trimtab or lean) on ``bed``, sampled. Blocks."""
    sizes = model_sizes(100)
    sampler = Sampler()
    sampler.start()
    marks: dict[str, Any] = {}
    watcher = threading.Thread(target=_steady_then_windows, args=(sampler, perf, marks))
    watcher.start()
    if kind == "trimtab":
        step_s = statistics.median(run_trimtab(sizes, steps, 1 << 20, testbed=bed, warmup=WARMUP))
    else:
        layout = place(bed.hosts, 2, 2)
        step_s = leanps.run_lean(sizes, steps, 1 << 20, layout=layout, warmup=WARMUP)["median_s"]
    watcher.join(timeout=120)
    sampler.stopped.set()
    sampler.join()
    return {"kind": kind, "step_s": step_s, "marks": marks, "sampler": sampler}


def _window(run: dict[str, Any], which: str, steps: int) -> tuple[Any, Any, float]:
    """The samples at the ends of window ``which`` and the steps between them."""
    samples = run["sampler"].samples
    moved = [m for _, m, _ in samples if m is not None]
    per_step = (moved[-1] - moved[0]) / (steps + WARMUP)
    t0, t1 = run["marks"][which]
    inside = [s for s in samples if t0 <= s[0] <= t1 and s[1] is not None]
    first, last = inside[0], inside[-1]
    return first, last, (last[1] - first[1]) / per_step


def cpu_table(run: dict[str, Any], steps: int) -> dict[tuple[str, str], list[float]]:
    """(role, thread kind) -> [CPU ms, user ms, vcs, nvcs, threads] a step."""
    first, last, n = _window(run, "cpu", steps)
    roles, names = run["sampler"].roles, run["marks"].get("names", {})
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    table: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0] * 5)
    for pid, now in last[2].items():
        before = first[2].get(pid, {})
        for tid, (comm, ns, user, vcs, nvcs) in now.items():
            if tid not in before:
                continue
            _, ns0, user0, vcs0, nvcs0 = before[tid]
            name = "MainThread" if tid == pid else kind_of(names.get(pid, {}).get(tid, comm))
            row = table[(roles[pid], name)]
            row[0] += (ns - ns0) / 1e6 / n
            row[1] += (user - user0) * tick_ms / n
            row[2] += (vcs - vcs0) / n
            row[3] += (nvcs - nvcs0) / n
            row[4] += 1
    return table


def perf_table(run: dict[str, Any], perf: Path, steps: int) -> dict[str, dict[str, float]]:
    """'role thread-kind' -> {shared object: ms a step} from perf's cpu-clock samples."""
    _, _, n = _window(run, "perf", steps)
    kinds: dict[int, str] = {}
    names = run["marks"].get("names", {})
    for _, _, snap in run["sampler"].samples:
        for pid, ths in snap.items():
            for tid, info in ths.items():
                name = "MainThread" if tid == pid else kind_of(names.get(pid, {}).get(tid, info[0]))
                kinds[tid] = f"{run['sampler'].roles[pid]} {name}"
    text = subprocess.run(
        ["perf", "script", "-i", str(perf), "-F", "tid,ip,sym,dso"], capture_output=True, text=True
    ).stdout
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in text.splitlines():
        fields = line.split(None, 2)
        if len(fields) < 3 or not fields[0].isdigit() or int(fields[0]) not in kinds:
            continue
        dso = fields[2].rsplit("(", 1)[-1].rstrip(")").split("/")[-1]
        out[kinds[int(fields[0])]][dso] += 1
    return {k: {d: c / n for d, c in v.most_common(6)} for k, v in out.items()}  # 999 Hz ~ ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bedcpu", description=__doc__.split("\n")[0])
    parser.add_argument("--order", default="trimtab,lean")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--perf", action="store_true", help="perf cpu-clock by shared object")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    results = []
    with shaped_bed(4) as bed, tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(args.order.split(",")):
            perf = Path(tmp) / f"{i}.data" if args.perf else None
            run = run_one(kind, bed, args.steps, perf)
            table = cpu_table(run, args.steps)
            result: dict[str, Any] = {
                "kind": kind,
                "step_s": round(run["step_s"], 5),
                "cpu_ms_per_step": round(sum(r[0] for r in table.values()), 1),
                "threads": {
                    f"{r} {k}": [round(x, 1) for x in v] for (r, k), v in sorted(table.items())
                },
            }
            if perf is not None and "perf" in run["marks"]:
                result["perf_ms_per_step"] = perf_table(run, perf, args.steps)
            results.append(result)
            step, cpu_ms = result["step_s"], result["cpu_ms_per_step"]
            print(f"== {kind}: step {step:.3f} s, CPU {cpu_ms} ms a step")
            for name, (cpu, user, vcs, nvcs, n) in result["threads"].items():
                print(f"  {name:28s} {cpu:7.1f} ms (user {user:5.1f})", end="")
                print(f"  vcs {vcs:5.0f}  nvcs {nvcs:5.0f}  x{n:.0f}")
            for name, dsos in result.get("perf_ms_per_step", {}).items():
                print(f"  perf {name:23s} " + ", ".join(f"{d} {ms:.1f}" for d, ms in dsos.items()))
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
