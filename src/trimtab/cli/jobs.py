"""``trimtab run`` and ``trimtab train``: a whole job on this machine."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trimtab.errors import ConfigError
from trimtab.launch.backends.slurm import in_allocation, submit
from trimtab.launch.job import Job
from trimtab.launch.spec import LaunchConfig, add_job_flags


def add_commands(sub: Any) -> None:
    """Add ``run`` and ``train`` to the subcommands ``sub`` (argparse's subparsers)."""
    run = sub.add_parser(
        "run",
        help="run a training script on a local cluster",
        description="Start a coordinator, servers and one worker process "
        "per --workers running COMMAND, e.g. "
        "`trimtab run -w 2 -s 2 -- python train.py`.",
    )
    add_job_flags(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.set_defaults(handler=_run)

    train = sub.add_parser("train", help="train the built-in example (digits MLP)")
    add_job_flags(train)
    train.add_argument("--epochs", type=int, default=30)
    train.add_argument("--batch-size", type=int, default=64, help="global batch (64)")
    train.add_argument("--lr", type=float, default=0.05)
    train.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with the results as the last line",
    )
    train.set_defaults(handler=_train)


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("nothing to run; usage: trimtab run -w 2 -s 2 -- python train.py")
    config = LaunchConfig.from_args(args)
    if config.backend == "slurm" and not in_allocation(os.environ):
        # Ask Slurm for an allocation and run this same command in it.
        tasks = 1 + config.settings.max_servers + config.settings.max_workers
        return submit([sys.executable, "-m", "trimtab", *sys.argv[1:]], config.nodes, tasks)
    if config.observe.no_dashboard:
        return Job(config, command).run()
    from trimtab.observe.terminal import run_with_status  # a status line under the output

    return run_with_status(lambda output: Job(config, command, output=output).run())


def _train(args: argparse.Namespace) -> int:
    # Imported here, not above: the progress display (rich) costs every other command
    # a tenth of a second at start-up.
    from trimtab.launch.train import run_training

    return run_training(args)
