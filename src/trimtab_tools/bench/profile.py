"""``trimtab bench datapath --profile DIR``: where the time of a trimtab step goes.

Runs the datapath workload (the same job as the benchmark: 2 workers x 2 servers) and,
over exactly its timed steps, measures two things per process of the job:

* the CPU time (user and kernel) and minor page faults of every OS thread
  (``/proc/PID/task/TID/stat``), Python's and the native ones (ZeroMQ's I/O threads,
  torch's), read just before the first timed step and just after the last;
* where each Python thread's wall time goes, line by line, running or waiting: py-spy
  samples every thread of each process (``py-spy record --pid --idle --nonblocking``,
  200 Hz), attached after the warm-up. Idle samples are kept on purpose: py-spy's
  guess of which threads are idle proved unreliable here (threads blocked in a ZeroMQ
  poll or recv counted as running part of the time, differently with and without
  ``--nonblocking``), so the stacks are read as wall time and the CPU figures come from
  the kernel.

The handshake: worker 0 prints ``READY`` after its warm-up and waits for a go file; this
module attaches py-spy, reads the CPU counters, and creates the file; worker 0 prints
``DONE`` after its last timed step and the counters are read again, while every worker
waits for a second file before it shuts down (a thread that ended first, under load,
would take its CPU time with it). py-spy is taken from
``PATH`` or installed into a venv of its own (``pip install py-spy``); without it, the
per-thread CPU times are still measured.

Writes into DIR: ``summary.txt`` (what it prints), ``summary.json``, and per process the
raw collapsed stacks ``<role>-<n>.pyspy.txt`` (flamegraph.pl or speedscope read them).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import linecache
import os
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trimtab.launch.cores import machine_cpu
from trimtab.launch.testbed import Testbed
from trimtab_tools.bench._venv import ToolUnavailable, default_cache_dir, ensure_venv
from trimtab_tools.bench.job import run_trimtab
from trimtab_tools.bench.markers import DONE, READY, read_file

__all__ = [
    "Role",
    "ThreadStat",
    "child_roles",
    "parse_collapsed",
    "profile_datapath",
    "pyspy_binary",
    "thread_stats",
]

RATE_HZ = 200
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_PYSPY_CHECK = (
    "import os, sys; p = os.path.join(os.path.dirname(sys.executable), 'py-spy'); "
    "assert os.access(p, os.X_OK), p; print(p)"
)


def pyspy_binary(*, install: bool = True) -> Path:
    """``py-spy`` from ``PATH``, else from ``pyspy-venv`` in the cache folder (made with
    ``pip install py-spy`` when ``install``). Blocks (a download the first time).
    Raises :class:`ToolUnavailable` saying why there is none."""
    found = shutil.which("py-spy")
    if found:
        return Path(found)
    _, path = ensure_venv(
        default_cache_dir() / "pyspy-venv", ("py-spy",), _PYSPY_CHECK, install=install
    )
    return Path(path)


@dataclasses.dataclass(frozen=True)
class Role:
    """A process of the job: ``role`` is coordinator, server or worker; ``n`` counts
    processes of that role in pid order."""

    role: str
    n: int
    pid: int

    @property
    def name(self) -> str:
        return f"{self.role}-{self.n}"


def _role_of(argv: Sequence[str]) -> str | None:
    if "trimtab_tools.bench._datapath_worker" in argv:
        return "worker"
    for role in ("server", "coordinator"):
        if role in argv and "trimtab" in argv:
            return role
    return None


def child_roles(parent: int) -> list[Role]:
    """The job's processes among ``parent``'s children, by role. Reads /proc; never
    blocks; a child that exits meanwhile is skipped."""
    found: list[tuple[str, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != parent:
            continue
        role = _role_of(argv)
        if role is not None:
            found.append((role, int(entry.name)))
    counts: collections.Counter[str] = collections.Counter()
    roles = []
    for role, pid in sorted(found):
        roles.append(Role(role, counts[role], pid))
        counts[role] += 1
    return roles


@dataclasses.dataclass(frozen=True)
class ThreadStat:
    """One thread's counters since it started: its name (``comm``), user and system CPU
    seconds, and minor page faults (first touches of fresh memory, mostly)."""

    comm: str
    user_s: float = 0.0
    sys_s: float = 0.0
    faults: int = 0

    def __sub__(self, before: ThreadStat) -> ThreadStat:
        return ThreadStat(
            self.comm,
            self.user_s - before.user_s,
            self.sys_s - before.sys_s,
            self.faults - before.faults,
        )


def thread_stats(pid: int) -> dict[int, ThreadStat]:
    """The counters of each thread of ``pid`` (``/proc/PID/task/TID/stat``), by thread
    id. Empty if the process is gone. Never blocks."""
    out: dict[int, ThreadStat] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            f = stat.rsplit(")", 1)[1].split()  # f[0] is field 3 (state) of proc(5)
            out[int(task.name)] = ThreadStat(
                comm, int(f[11]) * _TICK_S, int(f[12]) * _TICK_S, int(f[7])
            )
    return out


def parse_collapsed(text: str) -> list[tuple[int, str, list[str], int]]:
    """Parse py-spy's raw (collapsed) output made with ``--threads``:
    ``[(tid, thread name, frames root first, samples)]``. Pure; skips lines it does not
    understand."""
    rows = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        parts = stack.split(";")
        if not parts or not parts[0].startswith("thread ("):
            continue
        head = parts[0]
        tid_text = head[len("thread (") : head.index(")")]
        tid = int(tid_text, 16) if tid_text.startswith("0x") else int(tid_text)
        name = head.partition("): ")[2] or "?"
        rows.append((tid, name, parts[1:], int(count)))
    return rows


def _short(frame: str) -> str:
    """``func (/long/path/trimtab/_server.py:12)`` -> ``func (trimtab/_server.py:12)``."""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")")
    for anchor in ("/site-packages/", "/src/", "/lib/python3"):
        if anchor in path:
            path = path.split(anchor, 1)[1]
            break
    return f"{func} ({path})"


def _source(frame: str) -> str:
    where = frame.partition(" (")[2].rstrip(")")
    file, _, line = where.rpartition(":")
    if not line.isdigit():
        return ""
    return linecache.getline(file, int(line)).strip()


class _Window:
    """The profiled window: started on worker 0's READY, closed on its DONE."""

    def __init__(self, out: Path, go: Path, pyspy: Path | None) -> None:
        self.out, self.go, self.pyspy = out, go, pyspy
        self.roles: list[Role] = []
        self.spies: list[tuple[Role, subprocess.Popen[bytes]]] = []
        self.before: dict[int, dict[int, ThreadStat]] = {}
        self.after: dict[int, dict[int, ThreadStat]] = {}
        self.started = self.ended = 0.0
        self.machine_before = self.machine_after = (0.0, 0.0)
        self.spy_cpu = 0.0
        self.error: str | None = None

    def on_line(self, source: str, line: str) -> None:
        # Called on the launcher's output thread; the job waits for the go file meanwhile.
        try:
            if source == "worker 0" and line == READY:
                self._open()
            elif source == "worker 0" and line == DONE:
                self._close()
        except Exception as exc:  # reported after the job; the job must not hang on it
            self.error = f"profiling failed: {exc!r}"
        finally:
            if line == READY:
                self.go.touch()
            elif line == DONE:
                read_file(self.go).touch()  # the workers wait for it to shut down

    def _open(self) -> None:
        self.roles = child_roles(os.getpid())
        for role in self.roles if self.pyspy else []:
            with open(self.out / f"{role.name}.pyspy.log", "wb") as log:
                spy = subprocess.Popen(
                    [
                        str(self.pyspy),
                        "record",
                        "--pid",
                        str(role.pid),
                        "--threads",
                        "--idle",
                        "--nonblocking",
                        "--full-filenames",
                        "--rate",
                        str(RATE_HZ),
                        "--format",
                        "raw",
                        "--output",
                        str(self.out / f"{role.name}.pyspy.txt"),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.spies.append((role, spy))
        deadline = time.monotonic() + 10.0
        for role, _ in self.spies:  # wait until each is sampling
            logfile = self.out / f"{role.name}.pyspy.log"
            while b"Sampling" not in logfile.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.02)
        self.before = {r.pid: thread_stats(r.pid) for r in self.roles}
        self.spy_cpu = -self._spies_cpu()
        self.machine_before = machine_cpu() or (0.0, 0.0)
        self.started = time.perf_counter()

    def _close(self) -> None:
        self.ended = time.perf_counter()
        self.after = {r.pid: thread_stats(r.pid) for r in self.roles}
        self.machine_after = machine_cpu() or (0.0, 0.0)
        self.spy_cpu += self._spies_cpu()
        self.stop_spies()

    def _spies_cpu(self) -> float:
        stats = [t for _, spy in self.spies for t in thread_stats(spy.pid).values()]
        return sum(t.user_s + t.sys_s for t in stats)

    def stop_spies(self) -> None:
        """SIGINT every py-spy (it writes its file), then kill any that lingers."""
        for _, spy in self.spies:
            if spy.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    spy.send_signal(signal.SIGINT)
        for _, spy in self.spies:
            try:
                spy.wait(15.0)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()


def _thread_names(out: Path, roles: Sequence[Role]) -> dict[int, str]:
    names: dict[int, str] = {}
    for role in roles:
        path = out / f"{role.name}.pyspy.txt"
        if path.exists():
            for tid, name, _, _ in parse_collapsed(path.read_text()):
                names[tid] = name
    return names


#: A thread is shown line by line if it burns at least this share of the step in CPU.
_SHOWN_CPU_SHARE = 0.01


def _summarise(
    win: _Window, steps: int, times: list[float], pyspy_note: str | None
) -> dict[str, Any]:
    names = _thread_names(win.out, win.roles)
    per_role: dict[str, Any] = {}
    for role_name in ("worker", "server", "coordinator"):
        members = [r for r in win.roles if r.role == role_name]
        if not members:
            continue
        per = 1000 / steps / len(members)  # seconds in the window -> ms per step per process
        cpu: dict[str, float] = collections.defaultdict(float)
        sys_s: dict[str, float] = collections.defaultdict(float)
        faults: dict[str, int] = collections.defaultdict(int)
        for r in members:
            before = win.before.get(r.pid, {})
            for tid, after in win.after.get(r.pid, {}).items():
                d = after - before.get(tid, ThreadStat(after.comm))
                label = names.get(tid) or after.comm
                cpu[label] += d.user_s + d.sys_s
                sys_s[label] += d.sys_s
                faults[label] += d.faults
        order = sorted(cpu, key=lambda k: -cpu[k])
        cpu_ms = {k: round(cpu[k] * per, 3) for k in order}
        lines: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        funcs: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for r in members:
            path = win.out / f"{r.name}.pyspy.txt"
            if not path.exists():
                continue
            for _, thread, frames, count in parse_collapsed(path.read_text()):
                if frames:
                    lines[thread][frames[-1]] += count
                    for frame in dict.fromkeys(f for f in frames if "/trimtab/" in f):
                        funcs[thread][frame] += count
        scale = per / RATE_HZ  # samples -> ms per step per process
        threads = {}
        for thread, counter in lines.items():
            if cpu_ms.get(thread, 0.0) < _SHOWN_CPU_SHARE * 1000 * statistics.median(times):
                continue
            threads[thread] = {
                "cpu_ms_per_step": cpu_ms.get(thread),
                "wall_ms_per_step": round(sum(counter.values()) * scale, 3),
                "lines": [
                    {"ms": round(c * scale, 3), "frame": _short(f), "code": _source(f)}
                    for f, c in counter.most_common(10)
                ],
                "trimtab_functions": [
                    {"ms": round(c * scale, 3), "frame": _short(f)}
                    for f, c in funcs[thread].most_common(10)
                ],
            }
        per_role[role_name] = {
            "processes": len(members),
            "cpu_ms_per_step": round(sum(cpu_ms.values()), 3),
            "cpu_ms_per_step_by_thread": cpu_ms,
            "sys_ms_per_step_by_thread": {k: round(sys_s[k] * per, 3) for k in order},
            "faults_per_step_by_thread": {k: round(faults[k] * per / 1000) for k in order},
            "threads": threads,
        }
    window_s = win.ended - win.started
    total_cpu = sum(v["cpu_ms_per_step"] * v["processes"] for v in per_role.values())
    busy = win.machine_after[0] - win.machine_before[0]
    idle = win.machine_after[1] - win.machine_before[1]
    return {
        "steps": steps,
        "step_s": round(statistics.median(times), 5),
        "window_s": round(window_s, 3),
        "cpu_ms_per_step_all": round(total_cpu, 3),
        "cores_busy": round(total_cpu / 1000 * steps / window_s, 2) if window_s > 0 else None,
        "machine_cores": os.cpu_count(),
        "machine_cores_busy": round(busy / window_s, 2) if window_s > 0 else None,
        "machine_cores_idle": round(idle / window_s, 2) if window_s > 0 else None,
        "profiler_cores": round(win.spy_cpu / window_s, 2) if window_s > 0 else None,
        "pyspy": pyspy_note or f"py-spy --idle --nonblocking at {RATE_HZ} Hz (wall time)",
        "roles": per_role,
    }


def render(s: dict[str, Any]) -> str:
    """The text of ``summary.txt`` for a summary :func:`profile_datapath` returned. Pure."""
    out = [
        f"{s['steps']} timed steps, median {1000 * s['step_s']:.3f} ms under the profiler; "
        f"window {s['window_s']} s; all processes together {s['cpu_ms_per_step_all']} ms "
        f"of CPU per step = {s['cores_busy']} cores busy on average",
        f"the whole machine meanwhile ({s['machine_cores']} cores): "
        f"{s['machine_cores_busy']} cores busy, {s['machine_cores_idle']} idle "
        f"(py-spy itself: {s['profiler_cores']} cores)",
        f"stacks: {s['pyspy']}",
    ]
    for role, r in s["roles"].items():
        out += ["", f"== {role}: {r['cpu_ms_per_step']} ms CPU per step per process "]
        out[-1] += f"({r['processes']} processes); per step by thread: CPU ms (of it "
        out[-1] += "in the kernel), minor page faults:"
        out += [
            f"   {ms:9.3f}  ({r['sys_ms_per_step_by_thread'][thread]:.3f})  "
            f"{r['faults_per_step_by_thread'][thread]:6d}  {thread}"
            for thread, ms in r["cpu_ms_per_step_by_thread"].items()
            if ms >= 0.0005
        ]
        for thread, t in r["threads"].items():
            out.append(
                f"   -- thread {thread}: {t['cpu_ms_per_step']} ms CPU, "
                f"{t['wall_ms_per_step']} ms wall sampled per step; wall by line:"
            )
            for x in t["lines"]:
                code = f"   | {x['code']}" if x["code"] else ""
                out.append(f"   {x['ms']:9.3f}  {x['frame']}{code}")
            out.append("      wall by trimtab function (inclusive):")
            out += [f"   {x['ms']:9.3f}  {x['frame']}" for x in t["trimtab_functions"]]
    return "\n".join(out) + "\n"


def profile_datapath(
    out: Path,
    sizes: list[int],
    steps: int,
    chunk_bytes: int,
    *,
    workers: int = 2,
    servers: int = 2,
    warmup: int = 3,
    install: bool = True,
    testbed: Testbed | None = None,
) -> dict[str, Any]:
    """Profile the timed steps of one datapath job; write the files above into ``out``.
    ``testbed``: each role on its own host of that bed, every byte through TCP (the
    processes are still this one's children, and the counters and py-spy read them
    from the machine's side).

    Blocks for the job (about as long as the benchmark's trimtab part) plus, the first
    time, py-spy's install (not tried unless ``install``). Without py-spy (the reason is
    in the summary) only the per-thread CPU times are measured.

    Returns the summary (also written to ``out/summary.json``).

    Raises:
        RuntimeError: the job failed, or the profiling window never opened or closed.
    """
    out.mkdir(parents=True, exist_ok=True)
    pyspy: Path | None = None
    note: str | None = None
    try:
        pyspy = pyspy_binary(install=install)
    except ToolUnavailable as exc:
        note = f"no py-spy ({exc}); per-thread CPU times only"
    go = out / ".go"
    go.unlink(missing_ok=True)
    read_file(go).unlink(missing_ok=True)
    win = _Window(out, go, pyspy)
    info: dict[str, Any] = {}
    try:
        times = run_trimtab(
            sizes,
            steps,
            chunk_bytes,
            workers,
            servers,
            warmup=warmup,
            go_file=go,
            on_line=win.on_line,
            info=info,
            testbed=testbed,
        )
    finally:
        win.stop_spies()
        go.unlink(missing_ok=True)
        read_file(go).unlink(missing_ok=True)
    if win.error or not win.ended:
        raise RuntimeError(win.error or "the profiling window never closed (no DONE line)")
    summary = _summarise(win, steps, times, note)
    # The pushes servers read from shared memory: 0 where every byte went through TCP.
    summary["shared_pushes"] = info.get("shared_pushes")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.txt").write_text(render(summary))
    return summary
