"""One home for a job's settings: a frozen, validated dataclass per component.

Each field carries its default, its rule and the help of the command-line flag that sets
it (``Flag`` in the field's metadata), written once here. The coordinator's
:class:`~trimtab.roles.coordinator.CoordinatorConfig` and the launcher's
:class:`~trimtab.launch.spec.LaunchConfig` are composed from these, and the CLI's flags
are built from them (``trimtab.launch.spec.add_flags``), so a default or a rule cannot
drift apart between them.

The components (cf. torchtitan's per-component configs):

- :class:`PlacementSettings`: which server owns each chunk, and how big a chunk is;
- :class:`ConsistencySettings`: how far workers may run apart;
- :class:`BatchingSettings`: how each step's global batch is split;
- :class:`ElasticSettings`: live migration and server scaling;
- :class:`JobSettings`: the job's shape and the rules that tie components together
  (live migration and balanced batches need synchronous steps).

This module sits between the policies (whose registries name the choices) and the
roles; it reads no environment variable and imports no torch. Every error is a
:class:`~trimtab.errors.ConfigError` whose message names both the setting and its flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from trimtab.core.registry import Registry
from trimtab.errors import ConfigError
from trimtab.policies.batching import BATCHING
from trimtab.policies.consistency import CONSISTENCY
from trimtab.policies.placement import PLACEMENTS, is_live

__all__ = [
    "BatchingSettings",
    "ConsistencySettings",
    "ElasticSettings",
    "Flag",
    "JobSettings",
    "PlacementSettings",
    "flag",
]

#: The smallest chunk accepted: below it, per-message overhead dominates everything.
MIN_CHUNK_BYTES = 64


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a setting appears on the command line.

    Attributes:
        name: the long flag, e.g. ``--placement``; its argparse ``dest`` is the name
            without dashes, ``-`` as ``_``.
        help: the help text.
        choices: the legal values, or the registry whose names they are; ``None``: any.
        metavar: the placeholder shown in the usage line.
        short: a one-letter alias, e.g. ``-w``.
    """

    name: str
    help: str
    choices: Registry[Any] | tuple[str, ...] | None = None
    metavar: str | None = None
    short: str | None = None

    def choice_names(self) -> list[str] | None:
        """The legal values, if the flag has a fixed set."""
        if self.choices is None:
            return None
        if isinstance(self.choices, Registry):
            return self.choices.names()
        return list(self.choices)

    @property
    def dest(self) -> str:
        """The attribute of an ``argparse.Namespace`` that holds this flag's value."""
        return self.name.lstrip("-").replace("-", "_")


def flag(
    name: str,
    help: str,
    *,
    choices: Registry[Any] | tuple[str, ...] | None = None,
    metavar: str | None = None,
    short: str | None = None,
) -> dict[str, Flag]:
    """The metadata of a field set by the flag ``name`` (``dataclasses.field(metadata=...)``)."""
    return {"flag": Flag(name, help, choices, metavar, short)}


def _check_choice(kind: str, name: str, registry: Registry[Any], flag_name: str) -> None:
    if name not in registry.names():
        raise ConfigError(
            f"unknown {kind} {name!r}; choose one of {registry.names()} ({flag_name})"
        )


@dataclasses.dataclass(frozen=True)
class PlacementSettings:
    """Which server owns each chunk.

    Attributes:
        policy: the placement policy (``greedy``, ``hash``, ``mxnet``, ``psld``,
            ``psld-mxnet``); the ``psld`` ones move chunks live from measured speeds.
        chunk_bytes: the largest chunk, in bytes (a tensor below it is one chunk).
    """

    policy: str = dataclasses.field(
        default="greedy",
        metadata=flag(
            "--placement",
            "chunk placement (greedy); psld moves chunks live, psld-mxnet too from MXNet's map",
            choices=PLACEMENTS,
        ),
    )
    chunk_bytes: int = dataclasses.field(
        default=1 << 20, metadata=flag("--chunk-bytes", "largest chunk in bytes (1 MiB)")
    )

    def __post_init__(self) -> None:
        _check_choice("placement", self.policy, PLACEMENTS, "--placement")
        if self.chunk_bytes < MIN_CHUNK_BYTES:
            raise ConfigError(
                f"chunk_bytes must be at least {MIN_CHUNK_BYTES}, got {self.chunk_bytes} "
                "(--chunk-bytes)"
            )

    @property
    def live(self) -> bool:
        """Whether the policy moves chunks while the job runs."""
        return is_live(self.policy)


@dataclasses.dataclass(frozen=True)
class ConsistencySettings:
    """How far workers may run apart.

    Attributes:
        mode: the consistency policy (``bsp``, ``asp``, ``ssp``, ``saps``).
        staleness: the bound of ``ssp``: a worker may lead the slowest by this many
            clocks.
    """

    mode: str = dataclasses.field(
        default="bsp",
        metadata=flag(
            "--mode",
            "consistency: bsp (default), asp, ssp (with --staleness), saps",
            choices=CONSISTENCY,
        ),
    )
    staleness: int = dataclasses.field(
        default=3, metadata=flag("--staleness", "the bound of --mode ssp (3)")
    )

    def __post_init__(self) -> None:
        _check_choice("consistency mode", self.mode, CONSISTENCY, "--mode")
        if self.staleness < 0:
            raise ConfigError(f"staleness must be >= 0, got {self.staleness} (--staleness)")

    @property
    def synchronous(self) -> bool:
        """Whether every step waits for every worker (``bsp``)."""
        return self.mode == "bsp"


@dataclasses.dataclass(frozen=True)
class BatchingSettings:
    """How each step's global batch is split among the workers.

    Attributes:
        policy: ``equal``, or ``lbbsp``/``lbbsp-gpu`` (LB-BSP: by measured speed).
    """

    policy: str = dataclasses.field(
        default="equal",
        metadata=flag(
            "--batching",
            "split of the global batch: equal (default) or lbbsp (LB-BSP)",
            choices=BATCHING,
        ),
    )

    def __post_init__(self) -> None:
        _check_choice("batching", self.policy, BATCHING, "--batching")

    @property
    def balanced(self) -> bool:
        """Whether batch sizes follow the workers' speeds (anything but ``equal``)."""
        return self.policy != "equal"


@dataclasses.dataclass(frozen=True)
class ElasticSettings:
    """Live migration and server scaling.

    Attributes:
        max_servers: active servers the job may grow to (``psld``'s scale-out,
            ``trimtab scale``); 0 means the job's server count (no growth).
        rebalance_every: every this many steps, move every chunk to the next server
            (a forced migration, for tests and demonstrations; 0 = never).
        min_workers: below this many workers the job ends; 0 means the job's worker
            count (a lost worker ends the job, as without elasticity). Below the worker
            count, a lost worker is dropped and the others go on (elastic workers).
        max_workers: live workers the job may grow to (``trimtab scale --workers``, a
            worker started by hand with the job's address); 0 means the worker count.
        replicas: backups of each chunk on other servers (0 or 1), kept in step after
            aggregation, so that a server's death loses nothing (bsp, 2+ servers).
    """

    max_servers: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--max-servers",
            "servers the job may grow to (psld scale-out, trimtab scale); default --servers",
            metavar="K",
        ),
    )
    rebalance_every: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--rebalance-every",
            "force a live migration of every chunk every N steps (testing; bsp only)",
            metavar="N",
        ),
    )
    replicas: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--replicas",
            "backups of each chunk on other servers (0 or 1): a server's death loses "
            "nothing (bsp, 2+ servers)",
            metavar="R",
        ),
    )

    min_workers: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--min-workers",
            "go on without a lost worker while at least N remain (below: the job ends); "
            "default --workers (a lost worker ends the job)",
            metavar="N",
        ),
    )
    max_workers: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--max-workers",
            "workers the job may grow to (trimtab scale --workers); default --workers",
            metavar="K",
        ),
    )

    def __post_init__(self) -> None:
        if self.min_workers < 0 or self.max_workers < 0:
            raise ConfigError(
                "--min-workers and --max-workers must be >= 0 (0: the job's worker count)"
            )
        if self.max_servers < 0:
            raise ConfigError(f"max_servers must be >= 0, got {self.max_servers} (--max-servers)")
        if self.rebalance_every < 0:
            raise ConfigError(
                f"rebalance_every must be >= 0, got {self.rebalance_every} (--rebalance-every)"
            )
        if self.replicas not in (0, 1):
            raise ConfigError(f"replicas must be 0 or 1, got {self.replicas} (--replicas)")

    def limit(self, servers: int) -> int:
        """The most active servers a job that starts with ``servers`` may have."""
        return self.max_servers or servers


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """A job's shape and policies, checked together. Construction raises
    :class:`ConfigError` for any setting out of range or any pair that cannot work.

    Attributes:
        workers: worker processes the job waits for.
        servers: servers the job starts with.
        placement, consistency, batching, elastic: the components.
    """

    workers: int
    servers: int
    placement: PlacementSettings = dataclasses.field(default_factory=PlacementSettings)
    consistency: ConsistencySettings = dataclasses.field(default_factory=ConsistencySettings)
    batching: BatchingSettings = dataclasses.field(default_factory=BatchingSettings)
    elastic: ElasticSettings = dataclasses.field(default_factory=ElasticSettings)

    def __post_init__(self) -> None:
        if self.workers < 1 or self.servers < 1:
            raise ConfigError(
                "a job needs at least 1 worker and 1 server: --workers and --servers must "
                "be at least 1"
            )
        max_servers = self.elastic.max_servers
        if max_servers and max_servers < self.servers:
            raise ConfigError(
                f"max_servers ({max_servers}) is below num_servers ({self.servers}): "
                f"--max-servers ({max_servers}) must be at least --servers ({self.servers})"
            )
        if self.elastic.min_workers > self.workers:
            raise ConfigError(
                f"--min-workers ({self.elastic.min_workers}) is above --workers ({self.workers})"
            )
        if self.elastic.max_workers and self.elastic.max_workers < self.workers:
            raise ConfigError(
                f"--max-workers ({self.elastic.max_workers}) is below --workers ({self.workers})"
            )
        if self.batching.balanced and not self.consistency.synchronous:
            raise ConfigError(
                f"--batching {self.batching.policy} balances synchronous steps: use it with "
                f"--mode bsp, not {self.consistency.mode}"
            )
        if self.elastic.replicas:
            _check_replicas(self)
        if self.migrates and not self.consistency.synchronous:
            raise ConfigError(
                "live migration (--placement psld, --max-servers, --rebalance-every) hands "
                "chunks over at a synchronous step boundary: use it with --mode bsp, not "
                f"{self.consistency.mode}"
            )

    @property
    def max_servers(self) -> int:
        """The most active servers the job may have (``servers`` unless it may grow)."""
        return self.elastic.limit(self.servers)

    @property
    def max_workers(self) -> int:
        """The most live workers the job may have (``workers`` unless it may grow)."""
        return self.elastic.max_workers or self.workers

    @property
    def elastic_workers(self) -> bool:
        """Whether the job goes on without a lost worker or may take new ones."""
        e = self.elastic
        return bool(
            (e.min_workers and e.min_workers < self.workers) or e.max_workers > self.workers
        )

    @property
    def migrates(self) -> bool:
        """Whether chunks may move while the job runs: a live placement, forced
        rebalancing, or room to add servers."""
        return bool(
            self.placement.live or self.elastic.rebalance_every or self.max_servers > self.servers
        )


def _check_replicas(job: JobSettings) -> None:
    """Raise :class:`ConfigError` unless a job with replicas can run: 2+ servers, bsp."""
    if job.servers < 2:
        raise ConfigError("--replicas 1 puts each chunk's backup on another server: --servers 2+")
    if job.consistency.mode != "bsp":
        raise ConfigError(f"--replicas needs --mode bsp, not {job.consistency.mode}")


#: The components a job's flags are built from, in the order ``--help`` lists them.
COMPONENTS: Sequence[type] = (
    PlacementSettings,
    ConsistencySettings,
    BatchingSettings,
    ElasticSettings,
)


#: Where checkpoints go when no directory is given (relative to the coordinator's).
DEFAULT_CHECKPOINT_DIR = "trimtab-checkpoints"


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """Checkpoints of a running job, and resuming one from them.

    Attributes:
        every: write a checkpoint every this many steps (0: only when ``trimtab
            checkpoint`` asks).
        directory: where the checkpoints go, one subdirectory each; default the
            ``resume`` directory when resuming, else :data:`DEFAULT_CHECKPOINT_DIR`.
        resume: continue the job of a checkpoint: a checkpoint's directory, or one
            holding several (the newest complete one is taken). Empty: a fresh job.
        max_failures: end the job (status 1, naming the failure) once this many
            checkpoints in a row failed (0: never). A job whose last checkpoint failed
            ends with status 1 too, even if it trained to its end.
    """

    every: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--checkpoint-every",
            "write a checkpoint every N steps (values, optimizer state, clocks, map)",
            metavar="N",
        ),
    )
    directory: str = dataclasses.field(
        default="",
        metadata=flag(
            "--checkpoint-dir",
            f"where checkpoints go (default: the --resume directory, else "
            f"{DEFAULT_CHECKPOINT_DIR})",
            metavar="DIR",
        ),
    )
    resume: str = dataclasses.field(
        default="",
        metadata=flag(
            "--resume",
            "continue from the newest complete checkpoint in DIR (or the checkpoint DIR)",
            metavar="DIR",
        ),
    )

    max_failures: int = dataclasses.field(
        default=3,
        metadata=flag(
            "--checkpoint-failures",
            "end the job (status 1) once N checkpoints in a row failed (3; 0: never)",
            metavar="N",
        ),
    )

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ConfigError(
                f"checkpoint every must be >= 0, got {self.every} (--checkpoint-every)"
            )
        if self.max_failures < 0:
            raise ConfigError(
                f"checkpoint failures must be >= 0, got {self.max_failures} (--checkpoint-failures)"
            )
