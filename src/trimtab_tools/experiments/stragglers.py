"""``trimtab experiment stragglers``: worker stragglers, remedies side by side.

4 workers and 2 servers train the digits CNN (real compute, one thread each) over the
same global batches, with one straggler emulated by a slowdown factor (its real compute
plus a proportional sleep). On a small machine the 4 workers' real compute alone
saturates the cores, and a straggler's sleep then frees CPU for the others, which hides
the very effect under study; ``--sample-ms`` (default 1 ms) adds an emulated compute of
that many milliseconds per sample to every worker (a sleep, said beside the figures),
so the job is compute-bound per worker rather than CPU-bound as a whole.

Runs, one after the other in one invocation: ``bsp``, ``lbbsp`` (bsp with LB-BSP batch
sizes), ``asp``, ``ssp`` (staleness 3), ``saps``, and
``ddp`` (torch.distributed gloo allreduce data parallel, same model, batches, optimizer).

Reported per run: ``step_s`` (median step time seen by worker 0, never the straggler),
``time_to_target_s`` (worker 0's first evaluation at or above the target accuracy),
``final_accuracy`` (after every worker's last update), ``dropped``/``discounted``
(gradients SaPS dropped or down-weighted) and ``skipped`` (steps a straggler skipped
when told to refresh). ``ideal_step_s`` = B / (sum of worker speeds), the speeds
measured (samples/s, slowdown included) in the same invocation's bsp run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from trimtab.errors import ConfigError
from trimtab.launch.job import Job, LaunchConfig
from trimtab_tools.experiments.markers import STRAGGLERS_RESULT as RESULT

WORKERS = 4
SERVERS = 2
MODES = ("bsp", "lbbsp", "asp", "ssp", "saps", "ddp")
#: The LaunchConfig settings of each trimtab mode (ddp runs outside trimtab).
MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "bsp": {},
    "lbbsp": {"batching": "lbbsp"},
    "asp": {"consistency": "asp"},
    "ssp": {"consistency": "ssp", "staleness": 3},
    "saps": {"consistency": "saps"},
}
SCENARIOS: dict[str, Callable[[float, int], list[str]]] = {
    "static": lambda k, steps: [f"worker:3:slowdown={k:g}@0-"],
    "transient": lambda k, steps: [f"worker:3:slowdown={k:g}@{steps // 3}-{2 * steps // 3}"],
    "drifting": lambda k, steps: ["worker:2:drift=0.3", "worker:3:drift=0.4"],
}


def _trimtab_run(
    mode: str, stragglers: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    settings = MODE_SETTINGS[mode]
    config = LaunchConfig(
        workers=WORKERS, servers=SERVERS, stragglers=tuple(stragglers), **settings
    )
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
        "trimtab_tools.experiments._stragglers_worker",
        "--epochs",
        str(args.epochs),
        "--batch",
        str(args.batch),
        "--lr",
        str(args.lr),
        "--sample-ms",
        str(args.sample_ms),
    ]
    status = Job(config, command, output=output).run()
    if status != 0 or len(results) != WORKERS:
        raise RuntimeError(f"{mode} run failed (status {status}):\n" + "\n".join(log[-30:]))
    return results


def _ddp_run(stragglers: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trimtab_tools.experiments._ddp_worker",
                "--rank",
                str(r),
                "--world",
                str(WORKERS),
                "--port",
                str(port),
                "--epochs",
                str(args.epochs),
                "--batch",
                str(args.batch),
                "--lr",
                str(args.lr),
                "--sample-ms",
                str(args.sample_ms),
                "--straggler",
                ";".join(stragglers),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
        )
        for r in range(WORKERS)
    ]
    results: list[dict[str, Any]] = []
    outputs: list[list[str]] = [[] for _ in procs]

    def read(i: int) -> None:
        stream = procs[i].stdout
        assert stream is not None
        for line in stream:
            if line.startswith(RESULT):
                results.append(json.loads(line[len(RESULT) :]))
            else:
                outputs[i].append(line.rstrip())

    readers = [threading.Thread(target=read, args=(i,)) for i in range(WORKERS)]
    for t in readers:
        t.start()
    try:
        for p in procs:
            p.wait(timeout=900)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for t in readers:
            t.join(timeout=5)
    if any(p.returncode for p in procs) or len(results) != WORKERS:
        raise RuntimeError(
            "ddp run failed:\n" + "\n".join([ln for out in outputs for ln in out][-30:])
        )
    return results


def summarise(results: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """The figures of one run from its workers' result lines."""
    lead = next(r for r in results if r["rank"] == 0)
    reached = [t for t, _, acc in lead["evals"] if acc >= target]
    return {
        "step_s": round(statistics.median(lead["step_times"]), 5),
        "time_to_target_s": round(reached[0], 3) if reached else None,
        "final_accuracy": round(lead["final_accuracy"], 4),
        "train_s": round(max(r["train_s"] for r in results), 3),
        "steps": {str(r["rank"]): r["steps"] for r in results},
        "dropped": lead["dropped"],
        "discounted": lead["discounted"],
        "skipped": sum(r["skipped"] for r in results),
        "mean_batch": {str(r["rank"]): round(statistics.mean(r["sizes"]), 1) for r in results},
        "curve": [[round(t, 3), round(a, 4)] for t, _, a in lead["evals"]],
    }


def ideal_step_s(results: list[dict[str, Any]], batch: int) -> float:
    """B / sum of the workers' median speeds (samples/s)."""
    return float(batch / sum(statistics.median(r["speeds"]) for r in results))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every mode for one scenario. Blocks (minutes); raises RuntimeError."""
    steps = args.epochs * ((1797 * 4 // 5) // args.batch)
    stragglers = SCENARIOS[args.scenario](args.slowdown, steps)
    modes = [m for m in MODES if m in args.modes.split(",")]
    out: dict[str, Any] = {
        "scenario": args.scenario,
        "stragglers": stragglers,
        "slowdown": args.slowdown,
        "target_accuracy": args.target,
        "global_batch": args.batch,
        "workers": WORKERS,
        "emulated_ms_per_sample": args.sample_ms,
        "servers": SERVERS,
        "results": {},
    }
    for mode in modes:
        print(
            f"trimtab experiment stragglers: {args.scenario} / {mode} ...",
            file=sys.stderr,
            flush=True,
        )
        results = (
            _ddp_run(stragglers, args) if mode == "ddp" else _trimtab_run(mode, stragglers, args)
        )
        out["results"][mode] = summarise(results, args.target)
        if mode == "bsp":
            out["ideal_step_s"] = round(ideal_step_s(results, args.batch), 5)
    return out


def plot(out: dict[str, Any], path: str) -> None:
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, r in out["results"].items():
        if r["curve"]:
            ts, accs = zip(*r["curve"], strict=True)
            ax.plot(ts, accs, label=f"{mode} (step {r['step_s'] * 1000:.0f} ms)")
    ax.axhline(out["target_accuracy"], color="grey", linestyle=":", label="target")
    ax.set_xlabel("seconds")
    ax.set_ylabel("test accuracy (worker 0)")
    ax.set_ylim(0.5, 1.0)
    ax.set_title(f"stragglers: {out['scenario']} ({'; '.join(out['stragglers'])})")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default="static", choices=sorted(SCENARIOS))
    p.add_argument("--slowdown", type=float, default=3.0, help="the straggler's factor (3)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=128, help="global batch (128)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--target", type=float, default=0.93, help="target test accuracy")
    p.add_argument(
        "--sample-ms",
        type=float,
        default=1.0,
        help="emulated compute per sample on every worker, ms (1.0; 0 for none)",
    )
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    p.add_argument("--plot", metavar="PNG", help="accuracy-over-time plot (needs matplotlib)")


def main(args: argparse.Namespace) -> int:
    out = run(args)
    if args.plot:
        plot(out, args.plot)
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        print(
            f"scenario {out['scenario']}: ideal step {out.get('ideal_step_s')} s, "
            f"target accuracy {out['target_accuracy']}"
        )
        for mode, r in out["results"].items():
            print(
                f"  {mode:>6}: step {r['step_s']:.4f} s, to target {r['time_to_target_s']}"
                f" s, final {r['final_accuracy']}, dropped {r['dropped']}, discounted "
                f"{r['discounted']}, skipped {r['skipped']}"
            )
    return 0
