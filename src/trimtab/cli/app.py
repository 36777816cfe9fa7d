"""``trimtab``'s parser and entry point: the subcommand groups, and exit statuses."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from trimtab.cli import jobs, observe, plugins, roles, start, testbed
from trimtab.errors import ConfigError, JobAborted, TrimtabError
from trimtab.runtime.diagnostics import enable_stack_dumps


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every subcommand sets ``handler``, the function that
    carries it out (``args.handler(args) -> exit status``). Reads environment variables for the
    defaults of the by-hand role commands. Raises :class:`ConfigError` for a malformed
    one."""
    parser = argparse.ArgumentParser(
        prog="trimtab",
        description="A parameter server for PyTorch that stays fast when machines are slow.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    jobs.add_commands(sub)
    roles.add_commands(sub, os.environ)
    testbed.add_commands(sub)
    observe.add_commands(sub)
    start.add_commands(sub)
    plugins.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trimtab`` command. Blocks while the command runs; returns
    the process exit status: 2 for a usage or settings error, 1 when the job failed."""
    try:
        args = build_parser().parse_args(argv)
        enable_stack_dumps()  # kill -USR1 prints where a coordinator or server is
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"trimtab: {exc}", file=sys.stderr)
        return 2
    except JobAborted as exc:
        print(f"trimtab: job aborted: {exc}", file=sys.stderr)
        return 1
    except TrimtabError as exc:
        print(f"trimtab: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
