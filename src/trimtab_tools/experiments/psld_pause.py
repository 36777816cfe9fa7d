"""``trimtab experiment psld --scenario migration-pause | reaction``: PSLD's promise in
measurable form (issue 20).

* ``migration-pause``: 2 workers and 2 servers train a 32 MiB synthetic model (the real
  data path, no link emulation, emulated compute) twice in one run: ``steady`` (no
  migration) and ``forced`` (``--rebalance-every``: every chunk moves to the other
  server every N steps). Reported: ``p99_over_steady_p50``, the forced run's p99 step
  over the steady run's median (goal: at most 1.5), and the steps during which the map
  changed, with the step after, against the rest.
* ``reaction``: 2 workers and 4 servers at the emulated ``--link``; server 3 slows down
  to ``1 / --slowdown`` of it from step ``--slow-at``, and psld (4 servers, no
  scale-out) must move chunks off it. Reported: ``reaction_steps``, the steps from the
  first slow one (over twice the median before) to the first one the workers route by
  a new map (goal: at most 2), and ``slow_steps``, the step times in between.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from trimtab.launch.job import LaunchConfig
from trimtab_tools.experiments import psld

MIB = 1 << 20
#: The migration-pause job: 2 x 2, a 32 MiB model of 4 MiB tensors.
PAUSE_WORKERS = 2
PAUSE_SERVERS = 2
PAUSE_MODEL = [4 * MIB] * 8
#: The reaction job's slow server.
SLOW = 3


def percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank, as the other runs report p99)."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def migration_pause(args: argparse.Namespace) -> dict[str, Any]:
    """The job with and without forced migrations, one after the other. Blocks
    (about a minute); raises RuntimeError if a run failed."""
    runs: dict[str, Any] = {}
    for name, every in (("steady", 0), ("forced", args.rebalance_every)):
        config = LaunchConfig(
            workers=PAUSE_WORKERS,
            servers=PAUSE_SERVERS,
            chunk_bytes=args.chunk_bytes,
            rebalance_every=every,
        )
        print(f"trimtab experiment psld: migration-pause / {name} ...", file=sys.stderr, flush=True)
        r = psld.run_job(name, config, PAUSE_MODEL, args)
        times, epochs = r["step_times"], r["epochs"]
        moved = {i for i in range(1, len(epochs)) if epochs[i] != epochs[i - 1]}
        around = sorted(moved | {i + 1 for i in moved if i + 1 < len(times)})
        r["migration_steps"] = [times[i] for i in around]
        r["p50_migration_step_s"] = (
            round(statistics.median(r["migration_steps"]), 4) if around else None
        )
        runs[name] = r
    steady, forced = runs["steady"], runs["forced"]
    return {
        "scenario": "migration-pause",
        "workers": PAUSE_WORKERS,
        "servers": PAUSE_SERVERS,
        "model_bytes": sum(PAUSE_MODEL),
        "chunk_bytes": args.chunk_bytes,
        "rebalance_every": args.rebalance_every,
        "emulated_compute_ms": args.compute_ms,
        "steps": args.steps,
        "results": runs,
        "p99_over_steady_p50": round(forced["p99_step_s"] / steady["p50_step_s"], 3),
        "p50_over_steady_p50": round(forced["p50_step_s"] / steady["p50_step_s"], 3),
    }


def reaction(args: argparse.Namespace) -> dict[str, Any]:
    """psld (4 servers) with server :data:`SLOW` slowing down at ``--slow-at``. Blocks
    (about a minute); raises RuntimeError if the run failed."""
    link, slow, at = args.link, args.link / args.slowdown, args.slow_at
    specs = [f"server:{s}:bandwidth={link:g}B/s" for s in range(psld.SERVERS) if s != SLOW]
    specs += [
        f"server:{SLOW}:bandwidth={link:g}B/s@0-{at}",
        f"server:{SLOW}:bandwidth={slow:g}B/s@{at}-",
    ]
    config = LaunchConfig(
        workers=psld.WORKERS,
        servers=psld.SERVERS,
        placement="psld",
        chunk_bytes=args.chunk_bytes,
        stragglers=tuple(specs),
    )
    print("trimtab experiment psld: reaction / psld_fixed ...", file=sys.stderr, flush=True)
    r = psld.run_job("psld_fixed", config, psld.model("bandwidth"), args)
    # Step i of the figures is step i + warmup of the job; a server counts its steps
    # by the clocks it completed, so the first slow step is found in the step times:
    # the first from a little before --slow-at over twice the median of the ten before.
    epochs, times = r["epochs"], r["step_times"]
    first = max(1, at - args.warmup - 2)
    calm = times[max(0, first - 10) : first]
    slow_from = statistics.median(calm) * 2 if calm else 0.0
    slowed = next((i for i in range(first, len(times)) if times[i] > slow_from), None)
    moved = None
    if slowed is not None:
        before = epochs[slowed - 1]
        moved = next((i for i in range(slowed, len(epochs)) if epochs[i] != before), None)
    return {
        "scenario": "reaction",
        "workers": psld.WORKERS,
        "servers": psld.SERVERS,
        "link_bytes_per_s": link,
        "slowdown": args.slowdown,
        "slow_at": at,
        "steps": args.steps,
        "stragglers": specs,
        "results": {"psld_fixed": r},
        # The first slow step is s: a map routed by from step s + 1 reacted in 1 step.
        "first_slow_step": None if slowed is None else slowed + args.warmup,
        "reaction_steps": None if moved is None or slowed is None else moved - slowed,
        "slow_steps": None if moved is None or slowed is None else times[slowed:moved],
        "p50_before_s": round(statistics.median(calm), 4) if calm else None,
        "p50_after_s": round(statistics.median(times[first + 12 :]), 4)
        if len(times) > first + 12
        else None,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This module's flags (on ``trimtab experiment psld``)."""
    p.add_argument(
        "--rebalance-every",
        type=int,
        default=10,
        help="migration-pause: force a migration of every chunk every N steps (10)",
    )
    p.add_argument(
        "--slow-at", type=int, default=40, help="reaction: the first step of the slowdown (40)"
    )


def summary(out: dict[str, Any]) -> str:
    """The figures of :func:`migration_pause` or :func:`reaction`, for a person."""
    if out["scenario"] == "migration-pause":
        s, f = out["results"]["steady"], out["results"]["forced"]
        return (
            f"  steady: p50 {s['p50_step_s']} s, p99 {s['p99_step_s']} s\n"
            f"  forced (every {out['rebalance_every']} steps): p50 {f['p50_step_s']} s, "
            f"p99 {f['p99_step_s']} s, {f['migrations']} migrations, "
            f"{f['bytes_moved']} bytes moved, migration steps {f['migration_steps']}\n"
            f"  p99 forced / p50 steady: {out['p99_over_steady_p50']} (goal <= 1.5)"
        )
    r = out["results"]["psld_fixed"]
    return (
        f"  slowdown of server {SLOW} at step {out['slow_at']}: new map after "
        f"{out['reaction_steps']} steps (goal <= 2); p50 before {out['p50_before_s']} s, "
        f"after {out['p50_after_s']} s; {r['migrations']} migrations"
    )


def main(args: argparse.Namespace) -> int:
    """``trimtab experiment psld``: this module's scenarios, or :func:`psld.main`'s."""
    if args.scenario not in psld.PROMISE_SCENARIOS:
        return psld.main(args)
    out = migration_pause(args) if args.scenario == "migration-pause" else reaction(args)
    print(json.dumps(out) if args.json else summary(out), flush=True)
    return 0
