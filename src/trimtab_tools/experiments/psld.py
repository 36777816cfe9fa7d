"""``trimtab experiment psld``: server stragglers, placements side by side.

2 workers train a synthetic model through the real data path (real processes, real
sockets, the server-side optimizer) with **emulated compute** (a sleep per step), so the
data path and the placement are what is measured. Every server's link is emulated at
``--link`` bytes/s (a token bucket on what it receives and sends), so that servers, not
this machine's two cores, are the bottleneck; the scenario's straggler runs slower:

* ``skew``: no slow server; a model whose tensors MXNet's rule places unevenly (two big
  arrays land on the same server);
* ``bandwidth``: 1 of 4 servers at 1/4 of the link;
* ``moving``: the 1/4-speed server changes every ``--move-every`` steps.

For each scenario it runs, one after the other: ``no_straggler`` (greedy, no straggler),
``hash``, ``mxnet``, ``greedy``, ``psld`` (live rebalancing, may grow to one more
server) and ``psld_fixed`` (live rebalancing, no scale-out); in ``skew`` also
``psld_from_mxnet`` (live rebalancing from MXNet's map: psld repairing a blind rule's
skew while training runs). Reported per run:
``steps_per_s`` (over the whole run), ``p50_step_s``, ``p99_step_s``, ``ratio`` (to
no_straggler's steps/s), ``migrations``, ``bytes_moved``, ``servers`` (at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.launch.job import Job, LaunchConfig
from trimtab.launch.testbed import Testbed
from trimtab_tools.experiments import psld_bed
from trimtab_tools.experiments.markers import PSLD_RESULT as RESULT
from trimtab_tools.experiments.psld_bed import SLOW_HOST, shaped_bed

WORKERS = 2
SERVERS = 4
RUNS = ("no_straggler", "hash", "mxnet", "greedy", "psld", "psld_fixed")
#: Scenarios of issue 20's measurable promise, run by :mod:`.psld_pause`.
PROMISE_SCENARIOS = ("migration-pause", "reaction")
#: Runs of one scenario only.
EXTRA = {"skew": ("psld_from_mxnet",)}
MIB = 1 << 20


def model(scenario: str) -> list[int]:
    """Tensor sizes in bytes. ``skew``: arrays under MXNet's 10^6-element bound placed
    whole by (key * 9973) % 4, two big ones on server 0."""
    if scenario == "skew":
        return [3_600_000, 400_000, 400_000, 400_000] * 2
    return [MIB] * 8


def stragglers(scenario: str, steps: int, args: argparse.Namespace) -> list[str]:
    """Every server at the link speed, the straggler at ``1 / --slowdown`` of it."""
    link, slow = args.link, args.link / args.slowdown
    servers = SERVERS + 1
    if scenario == "skew":
        return [f"server:{s}:bandwidth={link:g}B/s" for s in range(servers)]
    if scenario == "bandwidth":
        return [f"server:{s}:bandwidth={link if s != 3 else slow:g}B/s" for s in range(servers)]
    specs = [f"server:{SERVERS}:bandwidth={link:g}B/s"]
    every = args.move_every
    for s in range(SERVERS):
        windows = [(a, a + every) for a in range(0, steps + every, every)]
        mine = [(a, b) for i, (a, b) in enumerate(windows) if i % SERVERS == s]
        free = 0
        for a, b in mine:
            if a > free:
                specs.append(f"server:{s}:bandwidth={link:g}B/s@{free}-{a}")
            specs.append(f"server:{s}:bandwidth={slow:g}B/s@{a}-{b}")
            free = b
        specs.append(f"server:{s}:bandwidth={link:g}B/s@{free}-")
    return specs


def one_run(
    name: str, scenario: str, args: argparse.Namespace, bed: Testbed | None = None
) -> dict[str, Any]:
    """Run one placement for one scenario (``bed``: on its hosts, its links shaped by
    :mod:`.psld_bed`). Blocks; raises RuntimeError if it failed."""
    sizes = model(scenario)
    specs = stragglers(scenario, args.steps, args)
    if name == "no_straggler":
        specs = [f"server:{s}:bandwidth={args.link:g}B/s" for s in range(SERVERS + 1)]
    placement = {
        "no_straggler": "greedy",
        "psld_fixed": "psld",
        "psld_from_mxnet": "psld-mxnet",
    }.get(name, name)
    most = SERVERS + 1 if name == "psld" else SERVERS
    if bed is not None:
        specs = []  # the kernel shapes the links
    specs = [s for s in specs if int(s.split(":")[1]) < most]
    config = LaunchConfig(
        workers=WORKERS,
        servers=SERVERS,
        max_servers=most,
        placement=placement,
        chunk_bytes=args.chunk_bytes,
        stragglers=tuple(specs),
    )
    return run_job(name, config, sizes, args, bed)


def run_job(
    name: str,
    config: LaunchConfig,
    sizes: list[int],
    args: argparse.Namespace,
    bed: Testbed | None = None,
) -> dict[str, Any]:
    """Run the experiment's worker script (``sizes``: its tensors in bytes, for
    ``args.steps`` steps of ``args.compute_ms``) as job ``config`` (``bed``: on its
    hosts); return its figures
    (``epochs``: the map's epoch after each step, warm-up left out). Blocks; raises
    RuntimeError if it failed."""
    results: list[dict[str, Any]] = []
    log: list[str] = []

    def output(source: str, line: str) -> None:
        if line.startswith(RESULT):
            results.append(json.loads(line[len(RESULT) :]))
        else:
            log.append(f"[{source}] {line}")

    command = [
        sys.executable,
        "-m",
        "trimtab_tools.experiments._psld_worker",
        "--sizes",
        ",".join(map(str, sizes)),
        "--steps",
        str(args.steps),
        "--compute-ms",
        str(args.compute_ms),
    ]
    where = psld_bed.layout(bed, config.servers) if bed is not None else None
    status = Job(config, command, output=output, testbed=bed, layout=where).run()
    if status != 0 or not results:
        raise RuntimeError(f"{name} run failed (status {status}):\n" + "\n".join(log[-30:]))
    r = results[0]
    times = r["times"][args.warmup :]
    ordered = sorted(times)
    epochs = r["epochs"][args.warmup :]
    # Steps during which the map changed (a migration's step) and the one after.
    changed = {i for i in range(1, len(epochs)) if epochs[i] != epochs[i - 1]}
    calm = [t for i, t in enumerate(times) if i not in changed and i - 1 not in changed]
    return {
        "steps_per_s": round(len(times) / sum(times), 3),
        "p50_step_s": round(statistics.median(times), 4),
        "p99_step_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4),
        "p50_calm_step_s": round(statistics.median(calm), 4) if calm else None,
        "migrations": r["migrations"],
        "bytes_moved": r["bytes_moved"],
        "servers": r["servers"],
        "step_times": [round(t, 4) for t in times],
        "epochs": epochs,
        # The run's record (trimtab.observe): its maps, joins and stragglers, by event.
        "record": str(Path(config.observe.runs_dir) / config.job)
        if config.observe.runs_dir
        else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every placement for one scenario. Blocks (minutes); raises RuntimeError."""
    wanted = args.runs.split(",")
    names = [n for n in RUNS + EXTRA.get(args.scenario, ()) if n in wanted]
    out: dict[str, Any] = {
        "scenario": args.scenario,
        "workers": WORKERS,
        "servers": SERVERS,
        "link_bytes_per_s": args.link,
        "slowdown": args.slowdown,
        "emulated_compute_ms": args.compute_ms,
        "steps": args.steps,
        "stragglers": stragglers(args.scenario, args.steps, args),
        "results": {},
    }
    with contextlib.ExitStack() as stack:
        bed = None
        if args.testbed:
            shape = (args.scenario, SERVERS, WORKERS, args.link, args.slowdown)
            bed = stack.enter_context(shaped_bed(*shape))
            out.update(testbed=True, hosts=len(bed.hosts), stragglers=[])
        for name in names:
            print(f"trimtab experiment psld: {args.scenario} / {name} ...", file=sys.stderr)
            # No straggler: the same bed with every server's link at full speed.
            if bed is not None and name == "no_straggler" and args.scenario == "bandwidth":
                bed.shape(SLOW_HOST, rate_mbit=args.link * 8 / 1e6)
            out["results"][name] = one_run(name, args.scenario, args, bed)
            if bed is not None and name == "no_straggler" and args.scenario == "bandwidth":
                bed.shape(SLOW_HOST, rate_mbit=args.link / args.slowdown * 8 / 1e6)
    ref = out["results"].get("no_straggler")
    for r in out["results"].values():
        r["ratio"] = round(r["steps_per_s"] / ref["steps_per_s"], 3) if ref else None
    return out


def plot(out: dict[str, Any], path: str) -> None:
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in out["results"].items():
        ax.plot(r["step_times"], label=f"{name} ({r['steps_per_s']:.1f} steps/s)")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (s, worker 0)")
    ax.set_yscale("log")
    ax.set_title(f"psld: {out['scenario']}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        default="bandwidth",
        choices=("skew", "bandwidth", "moving", *PROMISE_SCENARIOS),
        help="migration-pause and reaction: see trimtab_tools.experiments.psld_pause",
    )
    p.add_argument(
        "--runs",
        default=",".join(RUNS + EXTRA["skew"]),
        help="comma-separated subset (psld_from_mxnet: skew only)",
    )
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=1, help="steps left out of the figures (1)")
    p.add_argument("--compute-ms", type=float, default=20.0, help="emulated compute per step")
    p.add_argument(
        "--link", type=float, default=80e6, help="every server's emulated link, bytes/s (80e6)"
    )
    p.add_argument("--move-every", type=int, default=40, help="moving: steps per straggler")
    p.add_argument(
        "--slowdown",
        type=float,
        default=4.0,
        help="the straggler's link is this many times slower (4; e.g. 20: psld gives it "
        "nothing, re-measures it, and retires it once it was found slow twice)",
    )
    p.add_argument("--chunk-bytes", type=int, default=256 << 10)
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    p.add_argument("--plot", metavar="PNG", help="step-time plot (needs matplotlib)")
    p.add_argument(
        "--testbed",
        action="store_true",
        help="each role on a host of a test bed (root), links shaped by tc (psld_bed.py)",
    )


def main(args: argparse.Namespace) -> int:
    if not args.slowdown >= 1:
        print("trimtab experiment psld: --slowdown must be at least 1", file=sys.stderr)
        return 2
    out = run(args)
    if args.plot:
        plot(out, args.plot)
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        for name, r in out["results"].items():
            print(
                f"  {name:>12}: {r['steps_per_s']:.2f} steps/s (x{r['ratio']}), p50 "
                f"{r['p50_step_s']} s, p99 {r['p99_step_s']} s, {r['migrations']} "
                f"migrations, {r['bytes_moved']} bytes moved, {r['servers']} servers"
            )
    return 0
