"""``--trace DIR`` on a real job (a coordinator, two servers and two workers as
processes on loopback): every process writes its Chrome trace, the launcher merges
them into ``DIR/trace.json``, and in that file, on the coordinator's clock, each
chunk's push (a worker's) precedes its merge (a server's), which precedes the round's
update and the reply, which precedes the value the worker read."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import processes_of
from tests.observe_script import training_script
from trimtab.launch.job import Job, LaunchConfig
from trimtab.observe.settings import ObserveSettings

# Long enough (about 2 s of steps) for each member's heartbeat echo to sync its clock.
SCRIPT = training_script(0.08)

STEPS = 25
# Each time is a float of microseconds since the epoch: it resolves about 0.25 us, so
# two marks a microsecond apart may compare within that rounding.
EPS = 1.0
PROCESSES = ["coordinator", "server-0", "server-1", "worker-0", "worker-1"]


def test_a_trace_holds_every_process_and_each_push_precedes_its_merge_and_reply(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    trace_dir = tmp_path / "trace"
    config = LaunchConfig(
        workers=2,
        servers=2,
        chunk_bytes=4096,  # the first layer's weight is 4 chunks: rows of several
        observe=ObserveSettings(no_dashboard=True, runs_dir="", trace=str(trace_dir)),
    )
    lines: list[str] = []
    job = Job(
        config,
        [sys.executable, str(tmp_path / "train.py"), str(STEPS)],
        output=lambda source, line: lines.append(f"[{source}] {line}"),
    )
    assert job.run() == 0, "\n".join(lines)
    assert processes_of(config.job) == []
    assert any("trace: " in line and "5 processes" in line for line in lines), lines

    # One file per process, each a Chrome trace of its own.
    own = sorted(p.stem for p in trace_dir.glob("*.json") if p.name != "trace.json")
    assert own == PROCESSES
    for name in own:
        single = json.loads((trace_dir / f"{name}.json").read_text())
        assert single["traceEvents"], name
        meta = single["otherData"]["trimtab"]
        assert meta["dropped"] == 0
        if name != "coordinator":  # synced by its heartbeats' echoes
            assert meta["samples"] >= 1, (name, meta)
            # One host, one kernel clock: the estimate is within its own bound, so no
            # correction is applied (a correction would only add the estimate's noise).
            assert abs(meta["offset_s"]) <= meta["rtt_s"] / 2
            assert meta["correction_s"] == 0.0

    # `trimtab report --trace` merges again (roles started by hand have no launcher).
    (trace_dir / "trace.json").unlink()
    again = subprocess.run(
        [sys.executable, "-m", "trimtab", "report", "--trace", str(trace_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "5 processes" in again.stdout, again
    merged = json.loads((trace_dir / "trace.json").read_text())
    events = merged["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert sorted(names.values()) == PROCESSES
    for e in events:  # the Trace Event Format's keys, with numbers where numbers go
        assert {"name", "ph", "pid", "tid"} <= e.keys()
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ph"] in ("X", "i")
        if e["ph"] == "X":
            assert e["dur"] >= 0
    by_process: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] != "M":
            by_process[names[e["pid"]]].append(e)
    assert set(by_process) == set(PROCESSES)
    assert {e["name"] for e in by_process["coordinator"]} >= {"job", "member", "step"}

    # Per chunk, step and worker: the push, its merge, the update, the reply, the value.
    def key(e: dict) -> tuple[int, int, int]:
        return (e["tid"], e["args"]["step"], e["args"].get("worker", -1))

    pushes, values, merges, replies = {}, {}, {}, {}
    updates: dict[tuple[int, int], dict] = {}
    for worker in ("worker-0", "worker-1"):
        for e in by_process[worker]:
            assert key(e) not in (pushes if e["name"] == "push" else values)
            (pushes if e["name"] == "push" else values)[key(e)] = e
    for server in ("server-0", "server-1"):
        for e in by_process[server]:
            if e["name"] == "merge":
                merges[key(e)] = e
            elif e["name"] == "reply":
                replies[key(e)] = e
            else:
                assert e["name"] == "update"
                updates[(e["tid"], e["args"]["step"])] = e
    steps = {k[1] for k in pushes}
    assert len(steps) >= STEPS and len({k[0] for k in pushes}) >= 5  # chunks
    assert pushes.keys() == merges.keys() == replies.keys() == values.keys()
    for k, push in pushes.items():
        merge, reply, value = merges[k], replies[k], values[k]
        update = updates[(k[0], k[1])]
        assert push["ts"] < merge["ts"], (k, push, merge)
        assert merge["ts"] + merge["dur"] <= update["ts"] + EPS, (k, merge, update)
        assert update["ts"] + update["dur"] <= reply["ts"] + EPS, (k, update, reply)
        assert reply["ts"] < value["ts"], (k, reply, value)
