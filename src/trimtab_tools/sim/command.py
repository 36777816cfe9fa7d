"""``trimtab simulate``: a job of any size, simulated with the real policies.

Takes ``trimtab run``'s job flags (``--workers``, ``--servers``, ``--placement``,
``--chunk-bytes``, ``--mode``, ``--staleness``, ``--batching``, ``--max-servers``,
``--rebalance-every``, ``--min-workers``, ``--max-workers``, ``--straggler``,
``--fault`` for workers), built from the same settings dataclasses,
plus the modelled machines and model. It simulates that job, then (unless
``--no-pairs``) the policy pairs (:data:`~trimtab_tools.sim.scenarios.PAIRS`) on the
same cluster, and prints their figures; ``--sweep`` runs the pairs at several sizes and
``--plot`` draws throughput against size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from trimtab.errors import ConfigError
from trimtab.faults.kills import parse_faults
from trimtab.faults.stragglers import parse_stragglers
from trimtab.launch.spec import LaunchConfig, add_flags, job_settings_from_args
from trimtab.settings import (
    BatchingSettings,
    ConsistencySettings,
    ElasticSettings,
    PlacementSettings,
)
from trimtab_tools.sim.cluster import ClusterModel
from trimtab_tools.sim.job import SimJob, model_tensors
from trimtab_tools.sim.scenarios import PAIRS, SCENARIOS, pair, run_job, scenario

__all__ = ["add_arguments", "job_from_args", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``trimtab simulate``'s flags. Never blocks."""
    add_flags(p, LaunchConfig, ("workers", "servers"))
    add_flags(p, PlacementSettings)
    add_flags(p, ConsistencySettings)
    add_flags(p, BatchingSettings)
    add_flags(p, ElasticSettings, ("max_servers", "rebalance_every", "min_workers", "max_workers"))
    add_flags(p, LaunchConfig, ("stragglers", "faults"))
    g = p.add_argument_group("the simulated job")
    g.add_argument("--steps", type=int, default=200, help="steps (200)")
    g.add_argument("--warmup", type=int, default=1, help="first steps left out (1)")
    g.add_argument("--batch", type=int, default=32, help="samples per worker a step (32)")
    g.add_argument("--model-mb", type=float, default=100.0, help="model size, MiB (100)")
    g.add_argument("--tensors", type=int, default=50, help="tensors in the model (50)")
    g.add_argument(
        "--tensor-bytes",
        help="the model's tensors, bytes, comma-separated (overrides the two above)",
    )
    g.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="none",
        help="stragglers added to --straggler's for the job (none)",
    )
    g.add_argument("--slowdown", type=float, default=4.0, help="the scenarios' straggler (4)")
    m = p.add_argument_group("the modelled machines")
    m.add_argument("--sample-ms", type=float, default=10.0, help="compute per sample (10 ms)")
    m.add_argument(
        "--forward-share",
        type=float,
        default=1 / 3,
        help="compute share before the first gradient (1/3; 1: none during the compute)",
    )
    m.add_argument("--worker-gbit", type=float, default=25.0, help="worker NIC, Gbit/s (25)")
    m.add_argument("--server-gbit", type=float, default=25.0, help="server NIC, Gbit/s (25)")
    m.add_argument("--merge-gbs", type=float, default=4.0, help="server merge, GB/s (4)")
    m.add_argument("--update-gbs", type=float, default=8.0, help="server update, GB/s (8)")
    m.add_argument("--latency-us", type=float, default=50.0, help="one-way latency (50 us)")
    m.add_argument(
        "--message-us", type=float, default=0.0, help="CPU a message costs each end (0 us)"
    )
    m.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="each node's speed varies a step by a log-normal factor of this sd (0)",
    )
    m.add_argument("--seed", type=int, default=0, help="the jitter's random seed (0)")
    m.add_argument("--workers-per-host", type=int, default=1, help="workers sharing a NIC (1)")
    m.add_argument("--servers-per-host", type=int, default=1, help="servers sharing a NIC (1)")
    o = p.add_argument_group("output")
    o.add_argument("--no-pairs", action="store_true", help="the job only, not the pairs")
    o.add_argument(
        "--sweep",
        metavar="W,W,...",
        help="run the pairs at these worker counts (servers in --workers/--servers' ratio)",
    )
    o.add_argument("--plot", metavar="SVG", help="with --sweep: throughput against size")
    o.add_argument(
        "--plot-steps", metavar="SVG", help="each run's step times, as the experiments plot"
    )
    o.add_argument("--json", action="store_true", help="last line: one JSON object")
    p.set_defaults(handler=main)


def job_from_args(args: argparse.Namespace) -> SimJob:
    """The simulated job the flags describe. Raises :class:`ConfigError` naming the flag
    for a value out of range or settings that cannot work together."""
    settings = job_settings_from_args(args)
    cluster = ClusterModel(
        sample_s=args.sample_ms / 1e3,
        forward_share=args.forward_share,
        worker_nic_bps=args.worker_gbit * 1e9 / 8,
        server_nic_bps=args.server_gbit * 1e9 / 8,
        server_bps=args.merge_gbs * 1e9,
        update_bps=args.update_gbs * 1e9,
        latency_s=args.latency_us / 1e6,
        message_s=args.message_us / 1e6,
        jitter=args.jitter,
        seed=args.seed,
        workers_per_host=args.workers_per_host,
        servers_per_host=args.servers_per_host,
    )
    if args.tensor_bytes:
        try:
            tensors = tuple(int(x) for x in args.tensor_bytes.split(","))
        except ValueError:
            raise ConfigError(f"--tensor-bytes wants integers, got {args.tensor_bytes!r}") from None
    else:
        tensors = model_tensors(args.model_mb, args.tensors)
    specs = parse_stragglers(args.straggler) + scenario(
        args.scenario,
        settings.workers,
        settings.servers,
        args.steps,
        slowdown=args.slowdown,
        nic_bps=cluster.server_nic_bps,
    )
    return SimJob(
        settings,
        cluster,
        tuple(specs),
        tensors,
        steps=args.steps,
        batch=args.batch,
        warmup=args.warmup,
        faults=tuple(parse_faults(args.fault)),
    )


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--sweep wants worker counts like 10,100,1000, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--sweep worker counts must be >= 1, got {text!r}")
    return sizes


def sweep(base: SimJob, sizes: list[int], slowdown: float) -> list[dict[str, Any]]:
    """The pairs at each worker count of ``sizes``, the servers in ``base``'s ratio.
    Blocks (CPU); raises what a policy raises."""
    ratio = base.settings.workers / base.settings.servers
    points = []
    for workers in sizes:
        servers = max(1, round(workers / ratio))
        settings = dataclasses.replace(
            base.settings,
            workers=workers,
            servers=servers,
            elastic=ElasticSettings(rebalance_every=base.settings.elastic.rebalance_every),
        )
        job = dataclasses.replace(base, settings=settings, stragglers=(), faults=())
        print(f"trimtab simulate: {workers} workers, {servers} servers ...", file=sys.stderr)
        point: dict[str, Any] = {"workers": workers, "servers": servers}
        for name in PAIRS:
            point[name] = pair(name, job, slowdown)
        points.append(point)
    return points


def main(args: argparse.Namespace) -> int:
    """Run ``trimtab simulate``. Blocks (CPU, seconds to a minute). Returns the exit
    status; raises :class:`ConfigError` for bad flags (the CLI prints it)."""
    started = time.perf_counter()
    job = job_from_args(args)
    if args.plot and not args.sweep:
        raise ConfigError("--plot draws the --sweep: give --sweep 10,100,1000 too")
    out: dict[str, Any] = {
        "workers": job.settings.workers,
        "servers": job.settings.servers,
        "steps": job.steps,
        "chunks": len(job.chunks()),
        "model_bytes": sum(job.tensor_bytes),
        "global_batch": job.global_batch,
        "cluster": dataclasses.asdict(job.cluster),
    }
    out["run"] = run_job(job)
    slowest = [(out["run"]["slowest_decision_ms"], out["run"]["slowest_decision"])]
    if not args.no_pairs:
        out["pairs"] = {name: pair(name, job, args.slowdown) for name in PAIRS}
        for name, runs in out["pairs"].items():
            out[f"{name}_ratio"] = runs["ratio"]
            p = PAIRS[name]
            slowest += [
                (runs[x]["slowest_decision_ms"], runs[x]["slowest_decision"])
                for x in (p.policy, p.baseline)
            ]
    if args.sweep:
        out["sweep"] = sweep(job, _sizes(args.sweep), args.slowdown)
        if args.plot:
            from trimtab_tools.sim.plot import throughput_plot

            throughput_plot(out["sweep"], args.plot)
    if args.plot_steps:
        from trimtab_tools.sim.plot import step_plot

        runs = {"the job": out["run"]}
        for pair_name, pair_runs in out.get("pairs", {}).items():
            p = PAIRS[pair_name]
            for policy in (p.policy, p.baseline):
                runs[f"{policy}, {pair_runs['scenario']}"] = pair_runs[policy]
        title = f"trimtab simulate: {out['workers']} workers, {out['servers']} servers"
        step_plot(runs, args.plot_steps, title)
    ms, name = max(slowest, key=lambda x: x[0])
    out["slowest_decision_ms"], out["slowest_decision"] = ms, name
    out["wall_s"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        _print(out)
    return 0


def _print(out: dict[str, Any]) -> None:
    r = out["run"]
    print(
        f"{out['workers']} workers, {out['servers']} servers, {out['chunks']} chunks: "
        f"{r['throughput_samples_per_s']:.1f} samples/s, median step {r['median_step_s']:.4f} s, "
        f"{r['migrations']} migrations, slowest decision {r['slowest_decision_ms']:.1f} ms "
        f"({r['slowest_decision']})"
    )
    for name, runs in out.get("pairs", {}).items():
        p = PAIRS[name]
        a, b = runs[p.policy], runs[p.baseline]
        print(
            f"  {name} ({runs['scenario']}): x{runs['ratio']} "
            f"({a['median_step_s']:.4f} s vs {b['median_step_s']:.4f} s a step)"
        )
    print(
        f"  slowest decision {out['slowest_decision_ms']:.1f} ms ({out['slowest_decision']}); "
        f"{out['wall_s']:.1f} s"
    )
