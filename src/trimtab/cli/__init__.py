"""The ``trimtab`` command: run jobs, start roles by hand, train the example, benchmark.

Flags and environment variables are read here and only here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trimtab.errors import ConfigError, JobAborted, TrimtabError
from trimtab.launch.job import Job, LaunchConfig
from trimtab.policies.batching import BATCHING
from trimtab.policies.consistency import CONSISTENCY
from trimtab.policies.placement import PLACEMENTS
from trimtab.runtime.diagnostics import enable_stack_dumps


def _env_int(*names: str, default: int) -> int:
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    return default


def _add_job_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", "-w", type=int, default=2, help="worker processes (2)")
    p.add_argument("--servers", "-s", type=int, default=2, help="server processes (2)")
    p.add_argument(
        "--placement",
        default="greedy",
        choices=PLACEMENTS.names(),
        help="chunk placement (greedy); psld moves chunks live, psld-mxnet too from MXNet's map",
    )
    p.add_argument(
        "--chunk-bytes", type=int, default=1 << 20, help="largest chunk in bytes (1 MiB)"
    )
    p.add_argument(
        "--mode",
        default="bsp",
        choices=CONSISTENCY.names(),
        help="consistency: bsp (default), asp, ssp (with --staleness), saps",
    )
    p.add_argument("--staleness", type=int, default=3, help="the bound of --mode ssp (3)")
    p.add_argument(
        "--batching",
        default="equal",
        choices=BATCHING.names(),
        help="split of the global batch: equal (default) or lbbsp (LB-BSP)",
    )
    p.add_argument(
        "--compression",
        default="none",
        choices=("none", "fp16", "bf16"),
        help="gradients on the wire: none (default), fp16 or bf16 (half the push bytes)",
    )
    p.add_argument(
        "--straggler",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a straggler, e.g. worker:2:slowdown=3@0- (repeatable)",
    )
    p.add_argument(
        "--max-servers",
        type=int,
        default=0,
        metavar="K",
        help="servers the job may grow to (psld scale-out, trimtab scale); default --servers",
    )
    p.add_argument(
        "--rebalance-every",
        type=int,
        default=0,
        metavar="N",
        help="force a live migration of every chunk every N steps (testing; bsp only)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        metavar="S",
        help="stop a job still running after S seconds, every process printing its stacks "
        "first (exit status 124); default none",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="roles log at INFO level")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trimtab",
        description="A parameter server for PyTorch that stays fast when machines are slow.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser(
        "run",
        help="run a training script on a local cluster",
        description="Start a coordinator, servers and one worker process "
        "per --workers running COMMAND, e.g. "
        "`trimtab run -w 2 -s 2 -- python train.py`.",
    )
    _add_job_flags(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    train = sub.add_parser("train", help="train the built-in example (digits MLP)")
    _add_job_flags(train)
    train.add_argument("--epochs", type=int, default=30)
    train.add_argument("--batch-size", type=int, default=64, help="global batch (64)")
    train.add_argument("--lr", type=float, default=0.05)
    train.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with the results as the last line",
    )

    coord = sub.add_parser("coordinator", help="start a job's coordinator (multi-machine)")
    coord.add_argument(
        "--workers", type=int, default=_env_int("TRIMTAB_NUM_WORKERS", "DMLC_NUM_WORKER", default=1)
    )
    coord.add_argument(
        "--servers", type=int, default=_env_int("TRIMTAB_NUM_SERVERS", "DMLC_NUM_SERVER", default=1)
    )
    coord.add_argument("--host", default=os.environ.get("DMLC_PS_ROOT_URI", "127.0.0.1"))
    coord.add_argument("--port", type=int, default=_env_int("DMLC_PS_ROOT_PORT", default=0))
    coord.add_argument("--job", default=os.environ.get("TRIMTAB_JOB", "trimtab"))
    coord.add_argument("--placement", default="greedy", choices=PLACEMENTS.names())
    coord.add_argument("--chunk-bytes", type=int, default=1 << 20)
    coord.add_argument("--mode", default="bsp", choices=CONSISTENCY.names())
    coord.add_argument("--staleness", type=int, default=3)
    coord.add_argument("--batching", default="equal", choices=BATCHING.names())
    coord.add_argument("--rebalance-every", type=int, default=0)
    coord.add_argument("--max-servers", type=int, default=0)
    coord.add_argument("--address-file", type=Path, help="write the bound address here")
    coord.add_argument("--verbose", "-v", action="store_true")

    server = sub.add_parser("server", help="start a server (multi-machine)")
    server.add_argument(
        "--coordinator",
        default=_coordinator_from_env(),
        help="tcp://HOST:PORT (or TRIMTAB_COORDINATOR / DMLC_PS_ROOT_*)",
    )
    server.add_argument("--job", default=os.environ.get("TRIMTAB_JOB", "trimtab"))
    server.add_argument("--host", default=os.environ.get("DMLC_NODE_HOST", "127.0.0.1"))
    server.add_argument("--port", type=int, default=0)
    server.add_argument(
        "--straggler",
        action="append",
        default=[os.environ.get("TRIMTAB_STRAGGLERS", "")],
        metavar="SPEC",
        help="server straggler specs (those naming this server's index apply)",
    )
    server.add_argument(
        "--no-priority",
        action="store_true",
        default=os.environ.get("TRIMTAB_PRIORITY", "1") == "0",
        help="merge queued pushes in arrival order, not first layers first "
        "(for comparisons; or TRIMTAB_PRIORITY=0)",
    )
    server.add_argument("--verbose", "-v", action="store_true")

    scale = sub.add_parser("scale", help="ask a running job to go to K servers")
    scale.add_argument("--servers", type=int, required=True, help="the server count wanted")
    scale.add_argument(
        "--coordinator",
        default=_coordinator_from_env(),
        help="the job's coordinator, tcp://HOST:PORT (trimtab run prints it)",
    )
    scale.add_argument("--job", default=os.environ.get("TRIMTAB_JOB", "trimtab"))

    exp = sub.add_parser("experiment", help="experiments (whole jobs side by side)")
    exp_sub = exp.add_subparsers(dest="experiment", required=True)
    from trimtab_tools.experiments import psld, stragglers

    stragglers.add_arguments(
        exp_sub.add_parser("stragglers", help="worker stragglers: bsp, lbbsp, asp, ssp, saps, ddp")
    )
    psld.add_arguments(
        exp_sub.add_parser(
            "psld", help="server stragglers: hash, mxnet, greedy, psld placements side by side"
        )
    )

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    from trimtab_tools.bench import datapath, overlap

    datapath.add_arguments(bench_sub.add_parser("datapath", help="push+pull step vs limits, peers"))
    overlap.add_arguments(
        bench_sub.add_parser("overlap", help="next forward overlapping the step (model=, priority)")
    )
    return parser


def _coordinator_from_env() -> str | None:
    if os.environ.get("TRIMTAB_COORDINATOR"):
        return os.environ["TRIMTAB_COORDINATOR"]
    host, port = os.environ.get("DMLC_PS_ROOT_URI"), os.environ.get("DMLC_PS_ROOT_PORT")
    return f"tcp://{host}:{port}" if host and port else None


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trimtab`` command. Returns the process exit status."""
    args = _parser().parse_args(argv)
    enable_stack_dumps()  # kill -USR1 prints where a coordinator or server is
    try:
        if args.cmd == "run":
            return _cmd_run(args)
        if args.cmd == "train":
            from trimtab.launch.train import run_training

            return run_training(args)
        if args.cmd == "coordinator":
            return _cmd_coordinator(args)
        if args.cmd == "server":
            return _cmd_server(args)
        if args.cmd == "scale":
            return _cmd_scale(args)
        if args.cmd == "experiment":
            from trimtab_tools.experiments import psld, stragglers

            return psld.main(args) if args.experiment == "psld" else stragglers.main(args)
        if args.cmd == "bench":
            from trimtab_tools.bench import datapath, overlap

            return overlap.main(args) if args.bench == "overlap" else datapath.main(args)
    except ConfigError as exc:
        print(f"trimtab: {exc}", file=sys.stderr)
        return 2
    except JobAborted as exc:
        print(f"trimtab: job aborted: {exc}", file=sys.stderr)
        return 1
    except TrimtabError as exc:
        print(f"trimtab: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 2


def launch_config(args: argparse.Namespace) -> LaunchConfig:
    """The local job that ``run`` and ``train`` flags describe."""
    return LaunchConfig(
        workers=args.workers,
        servers=args.servers,
        placement=args.placement,
        chunk_bytes=args.chunk_bytes,
        consistency=args.mode,
        staleness=args.staleness,
        batching=args.batching,
        stragglers=tuple(args.straggler),
        compression=args.compression,
        rebalance_every=args.rebalance_every,
        max_servers=args.max_servers,
        deadline_s=args.deadline,
        verbose=args.verbose,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("nothing to run; usage: trimtab run -w 2 -s 2 -- python train.py")
    return Job(launch_config(args), command).run()


def _cmd_scale(args: argparse.Namespace) -> int:
    from trimtab.launch.job import ask_coordinator
    from trimtab.protocol.messages import Control

    if args.coordinator is None:
        raise ConfigError(
            "which job? give --coordinator tcp://HOST:PORT and --job ID (trimtab run "
            "prints both when started with --max-servers)"
        )
    reply = ask_coordinator(
        args.coordinator, args.job, {"o": int(Control.SCALE), "servers": args.servers}, 10.0
    )
    print(f"trimtab: the job goes to {reply['target']} servers", flush=True)
    return 0


def _cmd_coordinator(args: argparse.Namespace) -> int:
    from trimtab.roles.coordinator import Coordinator, CoordinatorConfig

    _logging(args.verbose)
    coord = Coordinator(
        CoordinatorConfig(
            num_workers=args.workers,
            num_servers=args.servers,
            job=args.job,
            host=args.host,
            port=args.port,
            placement=args.placement,
            chunk_bytes=args.chunk_bytes,
            consistency=args.mode,
            staleness=args.staleness,
            batching=args.batching,
            rebalance_every=args.rebalance_every,
            max_servers=args.max_servers,
        )
    )
    if args.address_file:
        tmp = args.address_file.with_suffix(".tmp")
        tmp.write_text(coord.address)
        tmp.rename(args.address_file)
    else:
        print(f"trimtab coordinator listening at {coord.address}", flush=True)
    coord.run()
    return 0


def _cmd_server(args: argparse.Namespace) -> int:
    import torch

    from trimtab.roles.server import Server, ServerConfig
    from trimtab.transport.zmq import spin_from_env

    _logging(args.verbose)
    if args.coordinator is None:
        raise ConfigError(
            "a server needs --coordinator tcp://HOST:PORT (or "
            "TRIMTAB_COORDINATOR, or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT)"
        )
    torch.set_num_threads(1)  # chunk-sized element-wise work: threads only add overhead
    from trimtab.faults.stragglers import parse_stragglers
    from trimtab.faults.throttle import ThrottledTransport
    from trimtab.roles.server.node import server_transport

    config = ServerConfig(
        coordinator=args.coordinator,
        job=args.job,
        host=args.host,
        port=args.port,
        priority=not args.no_priority,
        spin_s=spin_from_env(),
    )
    specs = [s for s in parse_stragglers(args.straggler) if s.role == "server"]
    throttle = None
    if specs:  # a slow server is emulated around it: its link is paced
        throttle = ThrottledTransport(server_transport(config), specs, args.job, args.coordinator)
    server = Server(config, throttle)
    if throttle is not None:
        throttle.follow(server)
    server.run()
    return 0
