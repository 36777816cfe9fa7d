"""What a local job is (:class:`LaunchConfig`), and the command-line flags that say it.

:class:`LaunchConfig` is composed of :mod:`trimtab.settings`' components (placement,
consistency, batching, elastic servers) plus what only the launcher needs (fault
injection, compression, deadline, where roles bind). Its fields stay flat, as callers
write them (``LaunchConfig(workers=2, placement="psld")``); :attr:`LaunchConfig.settings`
holds the composed, checked :class:`~trimtab.settings.JobSettings`.

The flags of ``trimtab run``, ``trimtab train`` and ``trimtab coordinator`` are built
from the fields' :class:`~trimtab.settings.Flag` metadata (:func:`add_flags`), read back
with :meth:`LaunchConfig.from_args`, and written for a child process with
:func:`to_argv`: each default, rule and help text is written once.
"""

from __future__ import annotations

import argparse
import dataclasses
import uuid
from typing import Any, TypeVar

from trimtab.errors import ConfigError
from trimtab.faults.kills import Action, parse_faults
from trimtab.faults.stragglers import parse_stragglers
from trimtab.frontend.compression import compressor
from trimtab.observe.settings import ObserveSettings
from trimtab.settings import (
    BatchingSettings,
    CheckpointSettings,
    ConsistencySettings,
    ElasticSettings,
    Flag,
    JobSettings,
    PlacementSettings,
    flag,
)

__all__ = [
    "LaunchConfig",
    "add_flags",
    "add_job_flags",
    "flag_fields",
    "from_args",
    "job_settings_from_args",
    "to_argv",
]

_T = TypeVar("_T")

_PLACEMENT = PlacementSettings()
_CONSISTENCY = ConsistencySettings()
_BATCHING = BatchingSettings()
_ELASTIC = ElasticSettings()


def flag_fields(cls: type, names: tuple[str, ...] | None = None) -> list[tuple[str, Flag, Any]]:
    """(field name, flag, default) of each flag-carrying field of ``cls``, in field order
    (or in the order of ``names``)."""
    found = {
        f.name: (f.name, f.metadata["flag"], f.default)
        for f in dataclasses.fields(cls)
        if "flag" in f.metadata
    }
    return [found[n] for n in names] if names is not None else list(found.values())


def add_flags(
    parser: argparse.ArgumentParser, cls: type, names: tuple[str, ...] | None = None
) -> None:
    """Add to ``parser`` the flags of the dataclass ``cls``'s fields (those in ``names``,
    in that order, if given), with their defaults, choices and help. Never blocks."""
    for _, meta, default in flag_fields(cls, names):
        opts = [meta.name, *([meta.short] if meta.short else [])]
        kwargs: dict[str, Any] = {"help": meta.help}
        if meta.metavar is not None:
            kwargs["metavar"] = meta.metavar
        if isinstance(default, bool):
            kwargs["action"] = "store_true"
        elif isinstance(default, tuple):
            kwargs.update(action="append", default=list(default))
        else:
            kwargs.update(type=type(default), default=default, choices=meta.choice_names())
        parser.add_argument(*opts, **kwargs)


def _values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``cls`` that ``args`` has flags for, by field name."""
    values: dict[str, Any] = {}
    for name, meta, _ in flag_fields(cls):
        if hasattr(args, meta.dest):
            value = getattr(args, meta.dest)
            values[name] = tuple(value) if isinstance(value, list) else value
    return values


def from_args(cls: type[_T], args: argparse.Namespace) -> _T:
    """An instance of the settings dataclass ``cls`` from parsed flags (as added by
    :func:`add_flags`). Raises :class:`ConfigError` as ``cls`` does."""
    return cls(**_values(cls, args))


def to_argv(settings: object) -> list[str]:
    """The flags that say ``settings`` (a settings dataclass) to another process's
    parser: ``["--placement", "psld", "--chunk-bytes", "1048576"]``. Never blocks."""
    argv: list[str] = []
    for name, meta, _ in flag_fields(type(settings)):
        value = getattr(settings, name)
        if isinstance(value, bool):
            argv += [meta.name] if value else []
        elif isinstance(value, tuple):
            for item in value:
                argv += [meta.name, str(item)]
        else:
            argv += [meta.name, str(value)]
    return argv


def job_settings_from_args(args: argparse.Namespace) -> JobSettings:
    """The job that ``--workers``, ``--servers`` and the components' flags describe.
    Raises :class:`ConfigError` for settings that cannot work."""
    return JobSettings(
        workers=args.workers,
        servers=args.servers,
        placement=from_args(PlacementSettings, args),
        consistency=from_args(ConsistencySettings, args),
        batching=from_args(BatchingSettings, args),
        elastic=from_args(ElasticSettings, args),
    )


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """A local job's shape. Construction raises :class:`ConfigError` for a setting out of
    range or settings that cannot work together (before anything starts).

    Attributes:
        workers: worker processes (each runs the command).
        servers: server processes.
        placement: initial placement policy (:attr:`PlacementSettings.policy`).
        chunk_bytes: largest chunk, in bytes.
        consistency: ``bsp``, ``asp``, ``ssp`` or ``saps``.
        staleness: the bound of ``ssp``.
        batching: ``equal``, ``lbbsp`` or ``lbbsp-gpu``.
        stragglers: straggler specs (see ``trimtab.faults.stragglers``), injected for experiments.
        faults: crashes and joins (see ``trimtab.faults.kills``), injected for tests and
            experiments: ``server:1:kill@30``, ``worker:0:kill@5:mid-push``, ``worker:+1@9``.
        compression: the workers' default gradient compression: ``none``, ``fp16``,
            ``bf16`` (what ``DistributedOptimizer`` uses unless given ``compression=``).
        rebalance_every: force a migration of every chunk every this many steps (0 =
            never; for tests and demonstrations of live migration; needs bsp).
        max_servers: live servers the job may grow to (psld's scale-out, ``trimtab
            scale``); the launcher starts them when the coordinator asks, and may start
            another after one retired. 0 = ``servers``.
        min_workers: go on without a lost worker while this many remain (0: a lost
            worker ends the job).
        max_workers: live workers the job may grow to (``trimtab scale --workers``);
            the launcher starts them when the coordinator asks. 0 = ``workers``.
        replicas: backups of each chunk (0 or 1); with one, a server that dies does
            not stop the job (its coordinator promotes the backups).
        job: job id; a fresh random one by default.
        host: the interface every role binds (loopback).
        startup_timeout_s: how long the coordinator may take to come up.
        grace_s: after the workers finish (or on a failure), how long the other
            processes get to exit before they are killed.
        deadline_s: stop the job if it is still running after this many seconds (0:
            never); every process prints its threads' stacks first, and ``Job.run``
            returns ``DEADLINE_STATUS``.
        verbose: let the roles log at INFO level.
        encrypt: encrypt TCP traffic between the roles (ZeroMQ CURVE, keys derived from
            the job's secret): for hosts whose network others can read or modify.
        no_auth: run without the job's secret: INSECURE (any local user can corrupt or
            stop the job); only to measure what authentication costs.
        testbed: run the roles on a test bed of this many hosts (0: this machine; see
            :mod:`trimtab.launch.hosts` for the layout).
        backend: where the roles run: ``local``, ``ray`` or ``slurm``
            (:mod:`trimtab.launch.backends`; ``testbed`` picks the bed's).
        address: with ``ray``: the cluster to join (``""``: ``RAY_ADDRESS``, or one
            of this machine's own).
        nodes: with ``slurm`` outside an allocation: the nodes ``salloc`` asks for.
        worker_cpus, worker_gpus, server_cpus: with ``ray``: what each worker and
            server actor takes.
        checkpoint: checkpoints of the job, and the checkpoint it resumes from.
        observe: the dashboard and the run record (:mod:`trimtab.observe`).
        settings: the job's policies as checked components (derived; not an argument).
    """

    workers: int = dataclasses.field(
        default=2, metadata=flag("--workers", "worker processes (2)", short="-w")
    )
    servers: int = dataclasses.field(
        default=2, metadata=flag("--servers", "server processes (2)", short="-s")
    )
    placement: str = _PLACEMENT.policy
    chunk_bytes: int = _PLACEMENT.chunk_bytes
    job: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])
    host: str = "127.0.0.1"
    consistency: str = _CONSISTENCY.mode
    staleness: int = _CONSISTENCY.staleness
    batching: str = _BATCHING.policy
    stragglers: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata=flag(
            "--straggler",
            "inject a straggler, e.g. worker:2:slowdown=3@0- (repeatable)",
            metavar="SPEC",
        ),
    )
    faults: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata=flag(
            "--fault",
            "inject a crash or a join, e.g. server:1:kill@30, worker:1:kill@60:mid-push, "
            "worker:+1@90 (repeatable; see trimtab.faults.kills)",
            metavar="SPEC",
        ),
    )
    compression: str = dataclasses.field(
        default="none",
        metadata=flag(
            "--compression",
            "gradients on the wire: none (default), fp16 or bf16 (half the push bytes)",
            choices=("none", "fp16", "bf16"),
        ),
    )
    rebalance_every: int = _ELASTIC.rebalance_every
    max_servers: int = _ELASTIC.max_servers
    min_workers: int = _ELASTIC.min_workers
    max_workers: int = _ELASTIC.max_workers
    replicas: int = _ELASTIC.replicas
    startup_timeout_s: float = 60.0
    grace_s: float = 10.0
    deadline_s: float = dataclasses.field(
        default=0.0,
        metadata=flag(
            "--deadline",
            "stop a job still running after S seconds, every process printing its stacks "
            "first (exit status 124); default none",
            metavar="S",
        ),
    )
    verbose: bool = dataclasses.field(
        default=False, metadata=flag("--verbose", "roles log at INFO level", short="-v")
    )
    encrypt: bool = dataclasses.field(
        default=False,
        metadata=flag(
            "--encrypt", "encrypt TCP traffic between the roles (ZeroMQ CURVE; costs CPU)"
        ),
    )
    no_auth: bool = dataclasses.field(
        default=False,
        metadata=flag(
            "--no-auth",
            "INSECURE: no per-job secret, so any local user can corrupt or stop the job "
            "(only to measure what authentication costs)",
        ),
    )
    testbed: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--testbed",
            "run the roles on a test bed of N hosts (network namespaces; needs root): "
            "coordinator and server 0 on host 0, server i on host i mod N, worker r on "
            "host (servers + r) mod N (docs/testbed.md)",
            metavar="N",
        ),
    )
    backend: str = dataclasses.field(
        default="local",
        metadata=flag(
            "--backend",
            "where the roles run: local (this machine, default), ray (Ray Core actors; "
            "pip install 'trimtab[ray]') or slurm (job steps; outside an allocation, "
            "salloc asks for one); docs/engines.md",
            choices=("local", "ray", "slurm"),
        ),
    )
    address: str = dataclasses.field(
        default="",
        metadata=flag(
            "--address",
            "with --backend ray: the cluster to join (ray.init's address; default: "
            "RAY_ADDRESS, or a cluster of this machine's own)",
            metavar="ADDR",
        ),
    )
    nodes: int = dataclasses.field(
        default=1,
        metadata=flag(
            "--nodes",
            "with --backend slurm outside an allocation: the nodes to ask for (1)",
            metavar="N",
        ),
    )
    worker_cpus: float = dataclasses.field(
        default=1.0,
        metadata=flag(
            "--worker-cpus", "with --backend ray: CPUs each worker takes (1)", metavar="N"
        ),
    )
    worker_gpus: float = dataclasses.field(
        default=0.0,
        metadata=flag(
            "--worker-gpus", "with --backend ray: GPUs each worker takes (0)", metavar="N"
        ),
    )
    server_cpus: float = dataclasses.field(
        default=1.0,
        metadata=flag(
            "--server-cpus", "with --backend ray: CPUs each server takes (1)", metavar="N"
        ),
    )
    checkpoint: CheckpointSettings = dataclasses.field(default_factory=CheckpointSettings)
    observe: ObserveSettings = dataclasses.field(default_factory=ObserveSettings)
    settings: JobSettings = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "settings",
            JobSettings(
                workers=self.workers,
                servers=self.servers,
                placement=PlacementSettings(self.placement, self.chunk_bytes),
                consistency=ConsistencySettings(self.consistency, self.staleness),
                batching=BatchingSettings(self.batching),
                elastic=ElasticSettings(
                    max_servers=self.max_servers,
                    rebalance_every=self.rebalance_every,
                    replicas=self.replicas,
                    min_workers=self.min_workers,
                    max_workers=self.max_workers,
                ),
            ),
        )
        if self.encrypt and self.no_auth:
            raise ConfigError("--encrypt needs the job's secret: drop --no-auth")
        if self.testbed < 0:
            raise ConfigError(f"--testbed takes a number of hosts, not {self.testbed}")
        if self.testbed and self.backend != "local":
            raise ConfigError("--testbed runs the roles on a bed: drop --backend")
        if self.nodes < 1:
            raise ConfigError(f"--nodes takes a number of nodes, not {self.nodes}")
        if self.address and self.backend != "ray":
            raise ConfigError("--address is a Ray cluster's: give --backend ray too")
        if min(self.worker_cpus, self.worker_gpus, self.server_cpus) < 0:
            raise ConfigError("--worker-cpus, --worker-gpus and --server-cpus must be >= 0")
        if self.testbed and self.settings.max_servers > self.servers:
            raise ConfigError(
                "--testbed with --max-servers: the launcher cannot reach a coordinator "
                "on the bed to grow the job (not supported yet)"
            )
        if self.deadline_s < 0:
            raise ConfigError(f"--deadline must be positive (0: none), not {self.deadline_s}")
        compressor(self.compression)  # refuse an unknown name before starting
        for spec in parse_stragglers(self.stragglers):  # refuse bad specs before starting
            count = self.workers if spec.role == "worker" else self.settings.max_servers
            if spec.index >= count:
                raise ConfigError(f"straggler {spec}: there are only {count} {spec.role}s")
        self._check_faults()

    def _check_faults(self) -> None:
        """Refuse ``faults`` that cannot parse or name a process the job never has."""
        faults = parse_faults(self.faults)
        joined = sum(f.count for f in faults if f.action is Action.JOIN)
        for f in faults:
            count = self.workers + joined if f.role == "worker" else self.settings.max_servers
            if f.action is Action.KILL and f.role != "coordinator" and f.index >= count:
                raise ConfigError(f"fault {f}: there are only {count} {f.role}s")

    @classmethod
    def of(cls, settings: JobSettings, **launcher: Any) -> LaunchConfig:
        """The local job of ``settings``, with the launcher's own fields (``stragglers``,
        ``compression``, ``deadline_s``, ...) as keywords. Raises as the constructor."""
        return cls(
            workers=settings.workers,
            servers=settings.servers,
            placement=settings.placement.policy,
            chunk_bytes=settings.placement.chunk_bytes,
            consistency=settings.consistency.mode,
            staleness=settings.consistency.staleness,
            batching=settings.batching.policy,
            rebalance_every=settings.elastic.rebalance_every,
            max_servers=settings.elastic.max_servers,
            min_workers=settings.elastic.min_workers,
            max_workers=settings.elastic.max_workers,
            replicas=settings.elastic.replicas,
            **launcher,
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchConfig:
        """The local job that ``trimtab run``/``train`` flags (:func:`add_job_flags`)
        describe. Raises :class:`ConfigError` for settings that cannot work."""
        settings = job_settings_from_args(args)
        own = _values(cls, args)
        for name in ("workers", "servers"):
            own.pop(name, None)
        checkpoint, observe = from_args(CheckpointSettings, args), from_args(ObserveSettings, args)
        return cls.of(settings, checkpoint=checkpoint, observe=observe, **own)


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a local job (``trimtab run``, ``trimtab train``). Never blocks."""
    add_flags(parser, LaunchConfig, ("workers", "servers"))
    add_flags(parser, PlacementSettings)
    add_flags(parser, ConsistencySettings)
    add_flags(parser, BatchingSettings)
    add_flags(parser, LaunchConfig, ("compression", "stragglers", "faults"))
    add_flags(parser, ElasticSettings)
    add_flags(parser, CheckpointSettings)
    add_flags(parser, ObserveSettings)
    add_flags(parser, LaunchConfig, ("deadline_s", "verbose", "encrypt", "no_auth", "testbed"))
    add_flags(
        parser,
        LaunchConfig,
        ("backend", "address", "nodes", "worker_cpus", "worker_gpus", "server_cpus"),
    )
