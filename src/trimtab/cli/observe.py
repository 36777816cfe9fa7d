"""``trimtab report RUN_DIR``: a run record as plots and one HTML page;
``trimtab report --trace DIR``: the processes' traces merged into ``DIR/trace.json``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError


def add_commands(sub: Any) -> None:
    """Add ``report`` to the subcommands ``sub`` (argparse's subparsers)."""
    report = sub.add_parser(
        "report",
        help="render a run record (runs/<id>/) as PNG plots and one HTML page",
        description="Plot a finished (or running) job's record: step time, throughput, "
        "per-server load, batch sizes and placement over time, and report.html holding "
        "them all with the summary and the timeline of events.",
    )
    report.add_argument(
        "run_dir", type=Path, nargs="?", metavar="RUN_DIR", help="a run record: runs/<id>/"
    )
    report.add_argument("--out", type=Path, help="where the files go (default: RUN_DIR)")
    report.add_argument(
        "--trace",
        type=Path,
        metavar="DIR",
        help="merge the trace files of DIR (--trace, TRIMTAB_TRACE: roles started by hand) "
        "into DIR/trace.json",
    )
    report.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    if args.trace is not None:
        from trimtab.observe.timeline import merge, summary

        try:
            print(summary(merge(args.trace)), flush=True)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if args.run_dir is None:
            return 0
    if args.run_dir is None:
        raise ConfigError("give a run record (trimtab report runs/<id>/) or --trace DIR")
    from trimtab.observe.report import render

    for path in render(args.run_dir, args.out):
        print(path, flush=True)
    return 0
