"""``trimtab experiment faults``: does a job lose nothing and roll nothing back when its
processes die?

Runs BSP jobs of 2 workers and 3 servers with ``--replicas 1`` (each one ``trimtab run``
driven through its flags and judged from its outputs, :mod:`.faultjob`):

- ``mixed``: a server killed with SIGKILL at 1/4 of the run, a worker at 1/2, a worker
  joining at 5/8 (``--fault server:1:kill@T1 worker:1:kill@T2 worker:+1@T3``);
- ``three_servers``: three server kills in one run, of 5 servers (so that two remain to
  hold each chunk and its re-created backup);
- ``migrating``: every chunk's roles move every 4 steps (``--rebalance-every 4``), and a
  server dies as a migration reaches it at 1/4 of the run
  (``--fault server:1:kill@T1:migrating``): the coordinator finds each chunk's newest
  copy;
- ``coordinator``: the coordinator killed at 1/4 of the run, its replacement at 1/2, and a
  server at 3/4 (``--fault coordinator:0:kill@T1 coordinator:1:kill@T2
  server:1:kill@T3``): each replacement rebuilds the job from its members, the last one
  fails the server over; ``rejoined_s`` is, per coordinator death, how long the workers
  waited for its replacement (training went on meanwhile);
- ``failover_cost``: 2 workers x 2 servers, the coordinator killed at 1/4 and its
  replacement at 1/2, against the same job without faults, as plain BSP and as the
  elastic job with replicas above: per job ``step_s`` (median), ``longest_step_s`` (the
  pause a death put into a step), ``recovery_s``, ``rejoined_s``;
- ``replicas_cost``: the same job without faults, with and without ``--replicas 1``;
  ``step_ratio`` is the median step time with replicas over without.

For each fault run it prints ``faults_injected``, ``lost_updates`` (per chunk, the
steps completed minus the updates the servers applied), ``equivalent`` (the final
parameters equal, to 1e-5, one process's SGD over the samples the workers logged as
processed), ``recovery_s`` (from each kill to the next completed step), and
``leaked_processes`` (processes of the job alive after ``trimtab run`` ended). A job
that did not finish says why (``reason``). Every fault run has ``--min-workers 1`` (a
lost worker is dropped, the job goes on).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def scenarios(steps: int) -> dict[str, tuple[list[str], int, list[str]]]:
    """Name -> (fault specs, servers, flags besides :data:`JOB_FLAGS`) of each fault run
    of ``steps`` steps."""
    q = steps // 4
    return {
        "mixed": (
            # The join leaves the new worker 30 steps (3 s at --pause 0.1) to start
            # Python and torch and reach a step boundary before the job ends.
            [f"server:1:kill@{q}", f"worker:1:kill@{2 * q}", f"worker:+1@{2 * q + q // 2}"],
            3,
            [],
        ),
        # Five servers, so that two remain to hold a chunk and its re-created backup.
        "three_servers": (
            [f"server:1:kill@{q}", f"server:2:kill@{2 * q}", f"server:0:kill@{3 * q}"],
            5,
            [],
        ),
        # Roles move every 4 steps; the server dies as the first move after T1 reaches it.
        "migrating": ([f"server:1:kill@{q}:migrating"], 3, ["--rebalance-every", "4"]),
        # The coordinator dies twice (its first replacement too), then a server.
        "coordinator": (
            [f"coordinator:0:kill@{q}", f"coordinator:1:kill@{2 * q}", f"server:1:kill@{3 * q}"],
            3,
            [],
        ),
    }


#: The flags of every run: a backup of each chunk, and a lost worker dropped (not the
#: job's end) while one remains.
JOB_FLAGS = ["--replicas", "1", "--min-workers", "1"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every run the arguments ask for. Blocks (minutes)."""
    from trimtab_tools.experiments.faultjob import judge, run_job  # loads torch

    base = JOB_FLAGS
    out: dict[str, Any] = {"workers": 2, "servers": 3, "steps": args.steps, "runs": {}}
    wanted = args.runs.split(",")
    for name, (faults, servers, flags) in scenarios(args.steps).items():
        if name not in wanted:
            continue
        _say(f"{name}: {servers} servers, --fault {' '.join(faults)} {' '.join(flags)}")
        seen = run_job(
            args.steps,
            faults,
            [*base, *flags],
            servers=servers,
            pause_s=args.pause,
            hidden=args.hidden,
            stall_s=args.stall,
            deadline_s=args.deadline,
        )
        out["runs"][name] = judge(seen, args.steps, args.hidden)
    if "failover_cost" in wanted:
        q = args.steps // 4
        kills = [f"coordinator:0:kill@{q}", f"coordinator:1:kill@{2 * q}"]
        failover: dict[str, Any] = {}
        for label, faults, flags in (
            ("bsp", kills, []),
            ("bsp_no_fault", [], []),
            ("elastic", kills, base),
            ("elastic_no_fault", [], base),
        ):
            _say(f"failover_cost: {label}")
            seen = run_job(
                args.steps,
                faults,
                flags,
                servers=2,
                pause_s=args.pause,
                hidden=args.hidden,
                stall_s=args.stall,
                deadline_s=args.deadline,
            )
            verdict = judge(seen, args.steps, args.hidden)
            keys = ("step_s", "longest_step_s", "recovery_s", "rejoined_s", "lost_updates")
            failover[label] = {k: verdict[k] for k in (*keys, "equivalent", "completed")}
        out["runs"]["failover_cost"] = failover
    if "replicas_cost" in wanted:
        cost: dict[str, Any] = {}
        for label, flags in (("without", []), ("with", ["--replicas", "1"])):
            _say(f"replicas_cost: {label} replicas")
            seen = run_job(
                args.steps,
                [],
                flags,
                hidden=args.hidden,
                stall_s=args.stall,
                deadline_s=args.deadline,
            )
            cost[f"step_s_{label}"] = judge(seen, args.steps, args.hidden)["step_s"]
        a, b = cost.get("step_s_with"), cost["step_s_without"]
        cost["step_ratio"] = round(a / b, 3) if a and b else None
        cost["hidden"] = args.hidden
        out["runs"]["replicas_cost"] = cost
    return out


def _say(text: str) -> None:
    print(f"trimtab experiment faults: {text}", file=sys.stderr, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runs",
        default="mixed,three_servers,migrating,coordinator,failover_cost,replicas_cost",
        help="comma-separated subset of mixed, three_servers, migrating, coordinator, "
        "failover_cost, replicas_cost",
    )
    p.add_argument("--steps", type=int, default=80, help="steps per run (80)")
    p.add_argument(
        "--pause", type=float, default=0.1, help="seconds each worker rests per step (0.1)"
    )
    p.add_argument("--hidden", type=int, default=64, help="the model's hidden width (64)")
    p.add_argument(
        "--stall", type=float, default=20.0, help="stop a run with no step done for S s (20)"
    )
    p.add_argument("--deadline", type=float, default=180.0, help="per run, seconds (180)")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")


def main(args: argparse.Namespace) -> int:
    out = run(args)
    if args.json:
        print(json.dumps(out), flush=True)
        return 0
    for name, r in out["runs"].items():
        if name == "failover_cost":
            for label, job in r.items():
                print(f"  failover_cost {label}: {job}")
            continue
        if name == "replicas_cost":
            print(
                f"  replicas_cost: step {r.get('step_s_with')} s with, {r['step_s_without']} s "
                f"without: x{r['step_ratio']}"
            )
            continue
        print(
            f"  {name}: faults_injected {r['faults_injected']} ({', '.join(r['faults'])}), "
            f"lost_updates {r['lost_updates']}, equivalent {r['equivalent']} "
            f"(max diff {r['max_diff']}), recovery_s {r['recovery_s']}, "
            f"leaked_processes {r['leaked_processes']}, completed {r['completed']}"
            + (f", rejoined_s {r['rejoined_s']}" if r.get("rejoined_s") else "")
            + (f"\n    reason: {r['reason']}" if "reason" in r else "")
        )
    return 0
