"""How the coordinator runs a job: its policies and their knobs, validated once.

The defaults and rules of the policy settings live in :mod:`trimtab.settings`; this
config lays them out flat (the fields the coordinator reads) and adds what only the
coordinator needs: where it binds and how it watches for dead nodes.
"""

from __future__ import annotations

import dataclasses

from trimtab.errors import ConfigError
from trimtab.settings import (
    BatchingSettings,
    CheckpointSettings,
    ConsistencySettings,
    ElasticSettings,
    JobSettings,
    PlacementSettings,
)

_PLACEMENT = PlacementSettings()
_CONSISTENCY = ConsistencySettings()
_BATCHING = BatchingSettings()
_ELASTIC = ElasticSettings()


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """How a job is shaped and how its coordinator behaves. Construction raises
    :class:`ConfigError` for a setting out of range or a pair of settings that cannot
    work together (the rules of :class:`~trimtab.settings.JobSettings`).

    Attributes:
        num_workers: workers the job waits for.
        num_servers: servers the job waits for.
        job: job id shared by every node; messages of other jobs are refused.
        host: interface to bind (loopback by default).
        port: port to bind; 0 picks a free one.
        placement: initial placement policy (:attr:`PlacementSettings.policy`).
        chunk_bytes: the largest chunk, in bytes.
        consistency: consistency policy name (:attr:`ConsistencySettings.mode`).
        staleness: the bound of ``ssp`` (a worker may lead the slowest by this many clocks).
        batching: how each step's global batch is split (``equal``, ``lbbsp``,
            ``lbbsp-gpu``); anything but ``equal`` needs ``bsp``.
        heartbeat_s: how often nodes say they are alive.
        dead_after_s: a node silent this long is dead and the job is aborted.
        rebalance_every: every this many steps, move every chunk to the next server
            (a forced migration, for tests and demonstrations; 0 = never). Needs bsp.
        max_servers: active servers the job may grow to (``psld`` adds one when a
            server straggles; ``trimtab scale`` asks for a count); retired servers do
            not count, so a job that gave one back may start another. Defaults to
            ``num_servers``.
        min_workers: below this many workers the job ends (0: ``num_workers``, a lost
            worker ends the job); below ``num_workers``, a lost worker is dropped.
        max_workers: live workers the job may grow to (0: ``num_workers``).
        replicas: backups of each chunk on other servers (0 or 1): with one, a
            server's death promotes the backups (:mod:`.recovery`); without, it ends
            the job naming the chunks lost.
        checkpoint: checkpoints (``--checkpoint-every``, ``--checkpoint-dir``) and
            the checkpoint to resume from (``--resume``).
        server_key: the job's server key (``TRIMTAB_SERVER_KEY``, from the launcher):
            a server joining a running job must show the join ticket made from it.
            Empty: only the servers the job starts with may join, before it is placed.
        rejoin: this coordinator replaces one that died: the job's members rejoin it
            (:mod:`.rejoin`) instead of registering.
        done_workers: with ``rejoin``, the worker ranks whose processes ended: they
            will not rejoin.
        rejoin_wait_s: with ``rejoin``, how long the members have to come back before
            the job ends (less than their own wait for a replacement, 30 s, so that
            they hear why).
    """

    num_workers: int
    num_servers: int
    job: str
    host: str = "127.0.0.1"
    port: int = 0
    placement: str = _PLACEMENT.policy
    chunk_bytes: int = _PLACEMENT.chunk_bytes
    consistency: str = _CONSISTENCY.mode
    staleness: int = _CONSISTENCY.staleness
    batching: str = _BATCHING.policy
    heartbeat_s: float = 1.0
    dead_after_s: float = 30.0
    rebalance_every: int = _ELASTIC.rebalance_every
    max_servers: int = _ELASTIC.max_servers
    replicas: int = _ELASTIC.replicas
    checkpoint: CheckpointSettings = dataclasses.field(default_factory=CheckpointSettings)
    server_key: bytes = dataclasses.field(default=b"", repr=False)
    min_workers: int = _ELASTIC.min_workers
    max_workers: int = _ELASTIC.max_workers
    rejoin: bool = False
    done_workers: tuple[int, ...] = ()
    rejoin_wait_s: float = 20.0

    def __post_init__(self) -> None:
        settings = self.settings()  # every policy rule, checked in one place
        object.__setattr__(self, "max_servers", settings.max_servers)
        if self.dead_after_s <= 2 * self.heartbeat_s:
            raise ConfigError("dead_after_s must be more than twice heartbeat_s")

    def settings(self) -> JobSettings:
        """These settings as components. Raises :class:`ConfigError` as the constructor."""
        return JobSettings(
            workers=self.num_workers,
            servers=self.num_servers,
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
        )

    @classmethod
    def of(
        cls,
        settings: JobSettings,
        *,
        job: str,
        host: str = "127.0.0.1",
        port: int = 0,
        server_key: bytes = b"",
        checkpoint: CheckpointSettings | None = None,
    ) -> CoordinatorConfig:
        """The coordinator of the job ``settings`` describe. Never blocks."""
        return cls(
            num_workers=settings.workers,
            num_servers=settings.servers,
            job=job,
            host=host,
            port=port,
            placement=settings.placement.policy,
            chunk_bytes=settings.placement.chunk_bytes,
            consistency=settings.consistency.mode,
            staleness=settings.consistency.staleness,
            batching=settings.batching.policy,
            rebalance_every=settings.elastic.rebalance_every,
            max_servers=settings.elastic.max_servers,
            replicas=settings.elastic.replicas,
            server_key=server_key,
            min_workers=settings.elastic.min_workers,
            max_workers=settings.elastic.max_workers,
            checkpoint=checkpoint or CheckpointSettings(),
        )
