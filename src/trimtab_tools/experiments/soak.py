"""``trimtab experiment soak --minutes M``: random (seeded) server and worker kills,
worker joins and forced migrations for M minutes, judged as the faults experiment's
runs are (:mod:`.faultjob`).

The soak runs jobs of ``--job-steps`` steps one after the other until the time is up
(the last one cut to the time left, by the step rate measured so far), each with faults
drawn at random steps: server kills (at most two of the three first servers), worker
kills at a random phase (never rank 0, which writes the final parameters) each followed
by a join, coordinator kills (each replacement rebuilds the job from its members), and
``--rebalance-every K`` (K drawn from 5..20) moving every chunk live.
Faults are at least ``--gap`` seconds of steps apart (by the measured rate), so the
worker a join starts is up (a new Python process importing torch) before a later kill
names its rank. Jobs are kept short because the judge compares the final parameters with
one process's to 1e-5: summed in another order, fp32 parameters drift apart over
thousands of steps even with no fault (5e-5 after 3,000 steps of this job, 0.1 after
9,000), which would say nothing of lost updates (counted exactly, by version). A job
that ends early (aborted, or hung: no step for ``--stall`` seconds) is followed by a
fresh one; the job running when the time is up is stopped. Every job has
``--replicas 1`` and ``--min-workers 1`` (the migrations move roles: a chunk onto its
backup); were ``--rebalance-every`` refused beside them, the soak would go on without
forced migrations and say so (``notes``).

Figures: ``jobs``, ``faults_injected``, ``lost_updates`` (over the jobs whose servers
could be asked), ``hung``, ``leaked_processes``, ``equivalent`` per job, and the RSS of
all the job's processes over time (``rss_mb``: [seconds since the start, MB]).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from trimtab_tools.experiments.faults import JOB_FLAGS


def plan(
    rng: random.Random, steps: int, servers: int, workers: int, gap: int = 40
) -> tuple[list[str], int]:
    """Fault specs for a job of ``steps`` steps, and its ``--rebalance-every``: events
    ``gap`` to ``2 * gap`` steps apart, a third of them coordinator kills."""
    faults: list[str] = []
    at: list[int] = []
    step = 5
    while (step := step + rng.randint(gap, 2 * gap)) < steps - 5:
        at.append(step)
    killable_servers = list(range(servers))
    rng.shuffle(killable_servers)
    killable_servers = killable_servers[: servers - 1]  # one of the first ones stays
    live = list(range(1, workers))  # the workers that may be killed: never rank 0
    next_rank = workers  # a join's rank: the next never used
    coordinators = 0  # the coordinator's number: 0 the first, 1 its replacement...
    for step in at:
        if rng.random() < 1 / 3:
            faults.append(f"coordinator:{coordinators}:kill@{step}")
            coordinators += 1
        elif killable_servers and (not live or rng.random() < 0.5):
            faults.append(f"server:{killable_servers.pop()}:kill@{step}")
        elif live:
            rank = live.pop(rng.randrange(len(live)))
            phase = rng.choice(("before-push", "mid-push", "after-reply"))
            faults.append(f"worker:{rank}:kill@{step}:{phase}")
            faults.append(f"worker:+1@{step + 2}")
            live.append(next_rank)
            next_rank += 1
    return faults, rng.randint(5, 20)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The soak. Blocks for about ``args.minutes`` minutes."""
    from trimtab_tools.experiments.faultjob import judge, run_job  # loads torch

    rng = random.Random(args.seed)
    base = JOB_FLAGS
    migrations = True  # --rebalance-every, unless this build refuses it beside the rest
    notes: list[str] = []
    started = time.monotonic()
    end = started + args.minutes * 60
    rate = args.rate  # steps per second, refined by each job
    jobs: list[dict[str, Any]] = []
    rss: list[tuple[float, float]] = []
    while time.monotonic() < end - 10:
        left = end - time.monotonic()
        steps = max(20, min(args.job_steps, int(rate * left)))
        faults, every = plan(rng, steps, 3, 2, gap=max(10, int(rate * args.gap)))
        flags = (["--rebalance-every", str(every)] if migrations else []) + base
        _say(f"job {len(jobs)}: {steps} steps, --rebalance-every {every}, --fault {faults}")
        offset = time.monotonic() - started
        seen = run_job(
            steps,
            faults,
            flags,
            pause_s=args.pause,
            stall_s=args.stall,
            stop_at=end,
            deadline_s=left + 60,
        )
        rss += [(round(offset + t, 1), mb) for t, mb in seen.rss_mb]
        verdict = judge(seen, steps)
        if seen.status == 2 and not seen.records:  # refused before it started
            if not migrations:
                notes.append(f"a job was refused: {verdict['reason']}")
                break
            migrations = False
            notes.append(f"forced migrations dropped: {verdict['reason']}")
            continue
        verdict["rebalance_every"] = every if migrations else None
        jobs.append(verdict)
        if verdict["step_s"]:
            rate = 1.0 / (verdict["step_s"] + 1e-3)
    known = [j for j in jobs if j["lost_updates"] is not None]
    return {
        "minutes": args.minutes,
        "seed": args.seed,
        "jobs": len(jobs),
        "faults_injected": sum(j["faults_injected"] for j in jobs),
        "lost_updates": sum(j["lost_updates"] for j in known) if known else None,
        "lost_unknown_jobs": len(jobs) - len(known),
        "hung": sum(1 for j in jobs if j["hung"]),
        "leaked_processes": sum(j["leaked_processes"] for j in jobs),
        "completed_jobs": sum(1 for j in jobs if j["completed"]),
        "equivalent": [j["equivalent"] for j in jobs],
        "rss_mb": rss,
        "runs": jobs,
        "wall_s": round(time.monotonic() - started, 1),
        "notes": notes,
    }


def _say(text: str) -> None:
    print(f"trimtab experiment soak: {text}", file=sys.stderr, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=10.0, help="how long (10)")
    p.add_argument("--seed", type=int, default=0, help="of the random plan (0)")
    p.add_argument("--pause", type=float, default=0.02, help="worker rest per step, s (0.02)")
    p.add_argument(
        "--stall", type=float, default=20.0, help="a job with no step for S s is hung (20)"
    )
    p.add_argument("--rate", type=float, default=15.0, help="steps/s to plan the first job by (15)")
    p.add_argument("--job-steps", type=int, default=600, help="steps of each job (600)")
    p.add_argument(
        "--gap", type=float, default=5.0, help="seconds of steps between two faults, at least (5)"
    )
    p.add_argument("--json", action="store_true", help="last line: one JSON object")


def main(args: argparse.Namespace) -> int:
    out = run(args)
    if args.json:
        print(json.dumps(out), flush=True)
        return 0
    rss = out["rss_mb"]
    print(
        f"soak of {out['minutes']} min (seed {out['seed']}): "
        f"{out['jobs']} jobs, {out['completed_jobs']} completed, faults_injected "
        f"{out['faults_injected']}, lost_updates {out['lost_updates']} (unknown in "
        f"{out['lost_unknown_jobs']} jobs), hung {out['hung']}, leaked_processes "
        f"{out['leaked_processes']}, equivalent {out['equivalent']}"
    )
    if rss:
        print(
            f"  RSS of the job's processes: {rss[0][1]} MB at start, max "
            f"{max(mb for _, mb in rss)} MB, {rss[-1][1]} MB at {rss[-1][0]} s"
        )
    for note in out["notes"]:
        print(f"  note: {note}")
    for i, j in enumerate(out["runs"]):
        if "reason" in j:
            print(f"  job {i}: {j['reason']}")
    return 0
