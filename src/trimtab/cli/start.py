"""``trimtab start -- COMMAND``: become the role the environment names
(:mod:`trimtab.launch.fromenv`), as a scheduler starts every role of a job with one
command line: Kubernetes (a JobSet), Slurm (``srun``), any other."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from trimtab.launch.fromenv import role_command


def add_commands(sub: Any) -> None:
    """Add ``start`` to the subcommands ``sub``."""
    start = sub.add_parser(
        "start",
        help="become the role TRIMTAB_ROLE names (for schedulers: Kubernetes, Slurm)",
        description="Run the role that the environment describes: TRIMTAB_ROLE "
        "(coordinator, server or worker; or DMLC_ROLE, or Slurm's task number), "
        "TRIMTAB_COORDINATOR=tcp://HOST:PORT, TRIMTAB_NUM_WORKERS, TRIMTAB_NUM_SERVERS, "
        "TRIMTAB_SECRET_FILE (a path; never the secret), a worker's rank (TRIMTAB_RANK, "
        "JOB_COMPLETION_INDEX or SLURM_PROCID) and one TRIMTAB_<FLAG> per setting, e.g. "
        "TRIMTAB_CHUNK_BYTES. A worker runs COMMAND. See docs/engines.md.",
    )
    start.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    start.set_defaults(handler=_start)


def _start(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    role = role_command(os.environ, command)
    print(f"trimtab start: {role.role}: {' '.join(role.argv)}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # The role becomes this process: the scheduler watches and signals it directly.
    os.execvpe(role.argv[0], role.argv, {**os.environ, **role.env})
