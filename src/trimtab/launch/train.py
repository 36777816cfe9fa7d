"""``trimtab train``: the built-in example on a local cluster, with a progress bar."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trimtab.examples.markers import PROGRESS, RESULT
from trimtab.launch.job import Job
from trimtab.launch.spec import LaunchConfig


class _TrainOutput:
    """Turns the workers' marker lines into a progress bar and a result; passes the rest
    through (to stderr, so that ``--json`` output stays the last line on stdout)."""

    def __init__(self, console: Console, show_progress: bool) -> None:
        self.console = console
        self.lock = threading.Lock()
        self.result: dict[str, Any] | None = None
        self.progress = Progress(
            TextColumn("[bold]training[/bold]"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TextColumn("{task.fields[loss]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not show_progress,
        )
        self.task = self.progress.add_task("train", total=None, loss="")

    def __call__(self, source: str, line: str) -> None:
        with self.lock:
            if line.startswith(PROGRESS):
                event = json.loads(line[len(PROGRESS) :])
                loss = f"loss {event['loss']:.3f}" if "loss" in event else ""
                self.progress.update(
                    self.task, completed=event["step"], total=event["total"], loss=loss
                )
            elif line.startswith(RESULT):
                self.result = json.loads(line[len(RESULT) :])
            else:
                self.console.print(f"[dim]\\[{source}][/dim] {line}", markup=True, highlight=False)


def run_training(args: argparse.Namespace) -> int:
    """Run the example job (``trimtab train``'s flags in ``args``); print a summary (or
    JSON). Blocks; returns the exit status. Raises :class:`ConfigError` for bad flags."""
    console = Console(stderr=True)
    if importlib.util.find_spec("sklearn") is None:  # before any process starts
        console.print(
            "trimtab train needs scikit-learn for the example's data (its bundled "
            "digits): pip install 'trimtab[example]'",
            style="red",
            markup=False,
            soft_wrap=True,
        )
        return 2
    out = _TrainOutput(console, show_progress=True)
    command = [
        sys.executable,
        "-m",
        "trimtab.examples.digits",
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--lr",
        str(args.lr),
    ]
    config = LaunchConfig.from_args(args)
    start = time.perf_counter()
    with out.progress:
        status = Job(config, command, output=out).run()
    wall = time.perf_counter() - start
    if status != 0 or out.result is None:
        console.print(f"[red]training failed (status {status})[/red]")
        return status or 1
    result = {
        **out.result,
        "servers": config.servers,
        "placement": config.placement,
        "testbed": config.testbed,
        "backend": config.backend,
        "wall_s": round(wall, 2),
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        table = Table(title="trimtab train: digits MLP")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in result.items():
            table.add_row(key, str(value))
        Console().print(table)
    return 0
