"""``trimtab run --fault``: a process killed at a step and phase really dies there.

Real jobs (2 workers, 3 servers, the faults experiment's worker script). What each
test asserts holds whether or not the job can recover from the death (server replicas,
elastic workers): the victim's marker line, the launcher's note, what the victim logged
before it died, and for ``after-reply`` that the step it died in was complete for the
others. Each job is then stopped (SIGTERM to the launcher) and must leave nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import processes_with
from trimtab.faults.kills import read_marker

STEP = 4


def start(tmp: Path, fault: str, *flags: str) -> subprocess.Popen[bytes]:
    """``trimtab run`` of 2 workers and 3 servers with ``--fault fault`` and ``flags``,
    40 steps of at least 50 ms each (long enough for the launcher to see a step's clock
    before the job ends, however fast the machine)."""
    out = (tmp / "out.txt").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trimtab",
            "run",
            "-w",
            "2",
            "-s",
            "3",
            "--fault",
            fault,
            "--deadline",
            "120",
            *flags,
            "--",
            sys.executable,
            "-m",
            "trimtab_tools.experiments._faults_worker",
            str(tmp),
            "40",
            "0.05",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def output(tmp: Path) -> str:
    return (tmp / "out.txt").read_text(errors="replace")


def logs(tmp: Path) -> dict[int, list[dict[str, Any]]]:
    """Each worker's log records, by rank."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for path in tmp.glob("worker-*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        if records:
            by_rank[records[0]["rank"]] = records
    return by_rank


def wait_for(what: str, check: Any, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def stop(job: subprocess.Popen[bytes]) -> None:
    if job.poll() is None:
        os.kill(job.pid, signal.SIGTERM)
    job.wait(timeout=30)


def leftovers(tmp: Path) -> list[str]:
    """The live processes of the job run in ``tmp`` (its workers have it as an argument,
    the others are the job's)."""
    return processes_with(arg=str(tmp))


def markers(tmp: Path) -> list[dict[str, Any]]:
    return [m for m in map(read_marker, output(tmp).splitlines()) if m is not None]


def done(records: list[dict[str, Any]], clock: int) -> bool:
    return any(r["clock"] == clock and "done" in r for r in records)


#: Where in its step a worker dies.
PHASES = ["before-push", "mid-push", "after-reply"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(  # (mid-push in the default run; the other two in the slow tier)
    "phase",
    [pytest.param(p, marks=pytest.mark.slow if p != "mid-push" else ()) for p in PHASES],
)
def test_a_worker_dies_at_its_step_and_phase(tmp_path: Path, phase: str) -> None:
    job = start(tmp_path, f"worker:1:kill@{STEP}:{phase}")
    try:
        wait_for("the launcher's note", lambda: "was killed by --fault" in output(tmp_path))
        if phase == "after-reply":  # its last push was answered: the step is complete
            wait_for("worker 0's step", lambda: done(logs(tmp_path).get(0, []), STEP), 30)
    finally:
        stop(job)
    text = output(tmp_path)
    [body] = markers(tmp_path)
    assert (body["spec"], body["step"], body["phase"]) == (
        f"worker:1:kill@{STEP}" + ("" if phase == "before-push" else f":{phase}"),
        STEP,
        phase,
    )
    assert "[worker 1] TRIMTAB_FAULT " in text
    assert "worker 1 was killed by --fault" in text
    victim = logs(tmp_path)[1]
    # It finished every step before STEP, began STEP, and never finished it.
    assert victim[-1] == {"rank": 1, "clock": STEP, "begin": victim[-1]["begin"]}
    assert done(victim, STEP - 1)
    if phase == "before-push":
        assert body["chunks_pushed"] == 0
    elif phase == "mid-push":  # six chunks: it dies once three have left
        assert (body["chunks_pushed"], body["chunks_before"]) == (3, 6)
    else:
        assert body["chunks_answered"] == 6
        assert done(logs(tmp_path)[0], STEP)
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(180)
def test_a_server_dies_as_it_applies_its_step(tmp_path: Path) -> None:
    job = start(tmp_path, f"server:1:kill@{STEP}")
    try:
        wait_for("the launcher's note", lambda: "was killed by --fault" in output(tmp_path))
    finally:
        stop(job)
    [body] = markers(tmp_path)
    assert (body["spec"], body["role"], body["index"], body["step"]) == (
        f"server:1:kill@{STEP}",
        "server",
        1,
        STEP,
    )
    assert body["version"] == STEP + 1  # step STEP's update was applied to that chunk
    assert "server" in "".join(
        line for line in output(tmp_path).splitlines() if "was killed by --fault" in line
    )
    # Every worker reached the step; no value of it left the server before it died, so
    # no worker finished it unless the job recovered (a backup took the chunks over).
    assert all(any(r["clock"] == STEP for r in rs) for rs in logs(tmp_path).values())
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(180)
def test_a_join_starts_a_worker_once_the_job_reached_its_step(tmp_path: Path) -> None:
    job = start(tmp_path, f"worker:+1@{STEP}", "--max-workers", "3")
    try:
        note = "[trimtab] --fault: a worker joins the job (worker 2)"
        wait_for("the launcher's note", lambda: note in output(tmp_path))
        # The coordinator reported a clock of STEP: some worker finished step STEP - 1.
        begun = [r["clock"] for rs in logs(tmp_path).values() for r in rs if "begin" in r]
        assert max(begun) >= STEP - 1
    finally:
        stop(job)
    assert output(tmp_path).count("a worker joins the job") == 1
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(120)
@pytest.mark.slow  # (two jobs of 11 to 14 s each: the slow tier, which .ci/run runs too)
@pytest.mark.parametrize("steps", [40, 140])
def test_a_worker_started_to_join_as_the_job_ends_does_not_hang_it(steps: int) -> None:
    """A join due near the end: the new worker is still importing torch when the others
    finish (40 steps), or registers while they run and declares once they are done (140
    steps, about 3 s after the join, on this machine). Either way the job ends with 0:
    the launcher stops a joiner whose job ended first, the coordinator refuses a DECLARE
    that has no step left to join (both hung until stopped)."""
    from trimtab_tools.experiments.faultjob import judge, run_job
    from trimtab_tools.experiments.faults import JOB_FLAGS

    faults = ["worker:1:kill@30:after-reply", "worker:+1@32"]
    seen = run_job(steps, faults, JOB_FLAGS, pause_s=0.02, stall_s=40, deadline_s=90)
    verdict = judge(seen, steps)
    assert seen.status == 0 and not seen.hung, "\n".join(seen.lines[-30:])
    assert verdict["completed"] and verdict["lost_updates"] == 0
    assert verdict["leaked_processes"] == 0
    assert any("a worker joins the job" in line for line in seen.lines)
