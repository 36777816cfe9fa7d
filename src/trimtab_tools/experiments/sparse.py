"""``trimtab experiment sparse``: a DLRM-shaped CTR model (tables of Zipf(1.1) ids, pooled
bags, an MLP) trained side by side, 2 servers x 2 workers, in one run:

- ``hot``: trimtab with the tables on the servers and each worker's hot rows replicated
  (NuPS);
- ``classic``: the same without hot rows (a classic row PS: every read goes out);
- ``ddp``: torch DDP over gloo with sparse gradients, every worker holding the whole
  tables (the allreduce way);

and one process over the same global batches, whose held-out log loss the others should
match. ``--testbed``: the two distributed runs on a bed of 4 hosts (network namespaces,
:mod:`trimtab.launch.testbed`): each server and each worker on its own host, DDP's two
workers on the workers' hosts; one process on this machine. Needs root. Prints
samples/s, held-out log loss and AUC, and each worker's peak RSS (the tables' size
beside it). ``--json``: one object (``results.hot``, ``.classic``,
``.ddp``, each with ``samples_per_s`` and ``log_loss``, and ``one_process_log_loss``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
from typing import Any

from trimtab.launch.hosts import Layout, place
from trimtab.launch.job import Job, LaunchConfig
from trimtab.launch.testbed import Testbed, unavailable

WORKER = "trimtab_tools.experiments._sparse_worker"
RESULT = "SPARSE-RESULT "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=500_000, help="rows per table (4 tables)")
    p.add_argument("--dim", type=int, default=16, help="row width (DLRM's configs: 16 to 128)")
    p.add_argument("--bag", type=int, default=4, help="ids per bag (multi-hot)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=512, help="global batch")
    p.add_argument("--hot", type=int, default=2000, help="hot rows per table (hot run)")
    p.add_argument("--uniform", action="store_true", help="uniform ids instead of Zipf(1.1)")
    p.add_argument("--chunk-bytes", type=int, default=4 << 20)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--no-prefetch",
        action="store_true",
        help="trimtab's workers read each batch's rows in its forward (no table.prefetch "
        "of the next batch's ids after step())",
    )
    p.add_argument("--testbed", action="store_true", help="each role on a host of a bed (root)")
    p.add_argument(
        "--consistency",
        choices=("bsp", "ssp", "asp"),
        default="bsp",
        help="ssp, asp: also run trimtab (hot and classic) under it, reported beside the BSP "
        "runs as results.hot_<mode> and .classic_<mode>; hot rows then are read afresh every "
        "--staleness steps (ssp) or every 10 (asp), in background of the step",
    )
    p.add_argument("--staleness", type=int, default=2, help="ssp's bound (2)")
    p.add_argument(
        "--table-gib",
        type=float,
        default=0.0,
        help="the memory run: tables of this many GiB in all (float32; --rows follows from "
        "it and --dim), trimtab alone (hot rows as --hot), each worker's peak RSS against "
        "a quarter of the tables plus the dense model",
    )


def _common(args: argparse.Namespace) -> list[str]:
    return [
        "--rows", str(args.rows), "--dim", str(args.dim), "--bag", str(args.bag),
        "--steps", str(args.steps),
        "--batch", str(args.batch), "--s", "0" if args.uniform else "1.1",
    ]  # fmt: skip


def _parse(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[len(RESULT) :]) for line in lines if line.startswith(RESULT)]


def _trimtab(
    args: argparse.Namespace, hot: int, bed: Testbed | None = None, consistency: str = "bsp"
) -> list[dict[str, Any]]:
    lines: list[str] = []
    config = LaunchConfig(
        workers=2,
        servers=2,
        chunk_bytes=args.chunk_bytes,
        deadline_s=1800.0,
        consistency=consistency,
        staleness=args.staleness,
    )
    command = [sys.executable, "-m", WORKER, "--mode", "trimtab", "--hot", str(hot)]
    if args.no_prefetch:
        command.append("--no-prefetch")
    where = None if bed is None else _layout(bed)
    job = Job(
        config,
        command + _common(args),
        output=lambda s, line: lines.append(line),
        testbed=bed,
        layout=where,
    )
    status = job.run()
    results = _parse(lines)
    if status != 0 or len(results) != 2:
        raise RuntimeError(f"the trimtab run failed ({status}):\n" + "\n".join(lines[-30:]))
    return results


def _layout(bed: Testbed) -> Layout:
    """Servers on hosts 0 and 1 (the coordinator with server 0), workers on 2 and 3."""
    return place(bed.hosts, servers=2, workers=2)


def _processes(
    args: argparse.Namespace, mode: str, world: int, bed: Testbed | None = None
) -> list[dict[str, Any]]:
    """``world`` worker processes of ``mode`` (DDP's on the bed's workers' hosts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    layout = Layout() if bed is None else _layout(bed)
    addr = layout.address(layout.worker(0), "127.0.0.1")
    nic = "lo" if bed is None else "eth0"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": nic}
    procs = []
    for r in range(world):
        command = [
            sys.executable, "-m", WORKER, "--mode", mode, "--rank", str(r),
            "--world", str(world), "--port", str(port), "--addr", addr, *_common(args),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                layout.run(layout.worker(r), command),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        )
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    results = _parse([line for out in outs for line in out.splitlines()])
    if any(p.returncode for p in procs) or len(results) != world:
        raise RuntimeError(f"the {mode} run failed:\n" + "\n".join(outs)[-3000:])
    return results


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    root = next(r for r in results if r["rank"] == 0)
    out = {
        "samples_per_s": min(r["samples_per_s"] for r in results),
        "log_loss": root["log_loss"],
        "auc": root["auc"],
        "peak_rss_mb": [
            round(r["peak_rss_mb"], 1) for r in sorted(results, key=lambda r: r["rank"])
        ],
    }
    if "hot" in root:
        out["hot"] = root["hot"]
    return out


def _memory(args: argparse.Namespace) -> int:
    """The memory run (``--table-gib``): prints each worker's peak RSS beside the bound."""
    args.rows = int(args.table_gib * 2**30) // (4 * args.dim * 4)
    runs = _trimtab(args, args.hot)
    table_bytes = 4 * args.rows * args.dim * 4
    dense = max(r["dense_bytes"] for r in runs)
    bound_mb = (table_bytes / 4 + dense) / 2**20
    peaks = [round(r["peak_rss_mb"], 1) for r in sorted(runs, key=lambda r: r["rank"])]
    report = {
        "workload": {
            "tables": 4, "rows_per_table": args.rows, "dim": args.dim, "steps": args.steps,
            "global_batch": args.batch, "workers": 2, "servers": 2, "hot_rows": args.hot,
        },
        "table_bytes": table_bytes,
        "dense_model_bytes": dense,
        "peak_rss_mb": peaks,
        "bound_mb": round(bound_mb, 1),
        "below_bound": max(peaks) < bound_mb,
        "samples_per_s": min(r["samples_per_s"] for r in runs),
        "log_loss": next(r["log_loss"] for r in runs if r["rank"] == 0),
    }  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"tables: 4 x {args.rows} rows x {args.dim} = {table_bytes / 2**30:.2f} GiB on 2 "
          f"servers; dense model {dense} bytes")  # fmt: skip
    print(f"peak RSS per worker: {peaks} MiB; bound (a quarter of the tables plus the dense "
          f"model): {bound_mb:.0f} MiB; below: {report['below_bound']}")  # fmt: skip
    return 0


def main(args: argparse.Namespace) -> int:
    if args.table_gib:
        return _memory(args)
    one = _summary(_processes(args, "one", 1))
    with contextlib.ExitStack() as stack:
        bed = None
        if args.testbed:
            why = unavailable()
            if why is not None:
                raise SystemExit(f"trimtab experiment sparse --testbed: no test bed here: {why}")
            bed = stack.enter_context(Testbed(4))
        results = {
            "hot": _summary(_trimtab(args, args.hot, bed)),
            "classic": _summary(_trimtab(args, 0, bed)),
            "ddp": _summary(_processes(args, "ddp", 2, bed)),
        }
        if args.consistency != "bsp":  # (beside the BSP runs, never instead of them)
            mode = args.consistency
            results[f"hot_{mode}"] = _summary(_trimtab(args, args.hot, bed, mode))
            results[f"classic_{mode}"] = _summary(_trimtab(args, 0, bed, mode))
    table_mb = 4 * args.rows * args.dim * 4 / 2**20
    speed = {name: r["samples_per_s"] for name, r in results.items()}
    report = {
        "workload": {
            "tables": 4, "rows_per_table": args.rows, "dim": args.dim, "bag": args.bag,
            "ids": "uniform" if args.uniform else "zipf(1.1)", "steps": args.steps,
            "global_batch": args.batch, "workers": 2, "servers": 2,
            "tables_mb": round(table_mb, 1), "testbed": bool(args.testbed),
            "prefetch": not args.no_prefetch, "consistency": args.consistency,
            "staleness": args.staleness if args.consistency == "ssp" else None,
        },
        "results": results,
        "one_process_log_loss": one["log_loss"],
        "one_process_samples_per_s": one["samples_per_s"],
        "ratios": {
            "hot_over_classic": speed["hot"] / speed["classic"],
            "hot_over_ddp": speed["hot"] / speed["ddp"],
            **(
                {
                    f"hot_{args.consistency}_over_classic": speed[f"hot_{args.consistency}"]
                    / speed["classic"],
                    f"hot_{args.consistency}_over_ddp": speed[f"hot_{args.consistency}"]
                    / speed["ddp"],
                }
                if args.consistency != "bsp"
                else {}
            ),
        },
    }  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"tables: 4 x {args.rows} rows x {args.dim} ({table_mb:.0f} MiB), bags of "
          f"{args.bag}, ids "
          f"{report['workload']['ids']}, {args.steps} steps of {args.batch}")  # fmt: skip
    print(f"{'run':8} {'samples/s':>10} {'log loss':>9} {'AUC':>6}  peak RSS per worker (MiB)")
    for name, r in results.items():
        print(f"{name:8} {r['samples_per_s']:10.0f} {r['log_loss']:9.4f} {r['auc']:6.3f}  "
              f"{r['peak_rss_mb']}")  # fmt: skip
    print(f"{'one':8} {one['samples_per_s']:10.0f} {one['log_loss']:9.4f} {one['auc']:6.3f}")
    hot = results["hot"].get("hot", {})
    print(f"hot set: {hot.get('rows')} rows, hit rate {hot.get('hit_rate', 0):.2f}; "
          f"hot/classic {report['ratios']['hot_over_classic']:.2f}x, "
          f"hot/ddp {report['ratios']['hot_over_ddp']:.2f}x")  # fmt: skip
    return 0
