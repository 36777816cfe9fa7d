"""The coordinator's command line, as the launcher starts it and, when it dies mid-job,
starts its replacement at the same address: the job's members rejoin that one
(:mod:`trimtab.roles.coordinator.rejoin`) and training goes on. Pure: nothing here
starts a process."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable

from trimtab.faults.kills import parse_faults
from trimtab.launch.spec import LaunchConfig, to_argv
from trimtab.settings import CheckpointSettings


def coordinator_argv(
    config: LaunchConfig, host: str, checkpoint: CheckpointSettings, number: int = 0
) -> list[str]:
    """``trimtab coordinator`` for the job ``config`` describes, bound on ``host``, with
    the checkpoint settings ``checkpoint`` (resolved: see :mod:`.resume`); the job's
    coordinator ``number`` (0 the first, 1 the first replacement...) is given the
    ``--fault`` kills of that number."""
    c = config
    kills = [s for s in parse_faults(c.faults) if s.role == "coordinator" and s.index == number]
    return [
        sys.executable,
        "-m",
        "trimtab",
        "coordinator",
        "--workers",
        str(c.workers),
        "--servers",
        str(c.servers),
        *to_argv(c.settings.placement),
        *to_argv(c.settings.consistency),
        *to_argv(c.settings.batching),
        *to_argv(c.settings.elastic),
        *to_argv(checkpoint),
        *to_argv(c.observe),
        "--job",
        c.job,
        "--host",
        host,
        *(["--verbose"] if c.verbose else []),
        *(f"--fault={s}" for s in kills),
    ]


def replacement_argv(
    config: LaunchConfig,
    host: str,
    checkpoint: CheckpointSettings,
    address: str,
    done: Iterable[int],
    number: int,
) -> list[str]:
    """The command line of the job's coordinator ``number`` (1 or more), replacing the
    one that died at ``address``: the same job on the same port, rejoined by its members,
    told which workers' processes ended already (``done``), and resuming from no
    checkpoint (the servers hold the parameters)."""
    port = address.rsplit(":", 1)[1]
    fresh = dataclasses.replace(checkpoint, resume="")
    first = coordinator_argv(config, host, fresh, number)
    ranks = ",".join(str(r) for r in sorted(done))
    return [*first, "--port", port, "--rejoin", *(["--done-workers", ranks] if ranks else [])]
