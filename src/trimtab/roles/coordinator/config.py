"""How the coordinator runs a job: its policies and their knobs, validated once."""

from __future__ import annotations

import dataclasses

from trimtab.errors import ConfigError
from trimtab.policies.batching import BATCHING
from trimtab.policies.consistency import CONSISTENCY
from trimtab.policies.placement import PLACEMENTS, is_live


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """How a job is shaped and how its coordinator behaves.

    Attributes:
        num_workers: workers the job waits for.
        num_servers: servers the job waits for.
        job: job id shared by every node; messages of other jobs are refused.
        host: interface to bind (loopback by default).
        port: port to bind; 0 picks a free one.
        placement: initial placement policy (``hash``, ``mxnet``, ``greedy``).
        chunk_bytes: the largest chunk, in bytes.
        consistency: consistency policy name (``bsp``, ``asp``, ``ssp``, ``saps``).
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
    """

    num_workers: int
    num_servers: int
    job: str
    host: str = "127.0.0.1"
    port: int = 0
    placement: str = "greedy"
    chunk_bytes: int = 1 << 20
    consistency: str = "bsp"
    staleness: int = 3
    batching: str = "equal"
    heartbeat_s: float = 1.0
    dead_after_s: float = 30.0
    rebalance_every: int = 0
    max_servers: int = 0

    def __post_init__(self) -> None:
        if self.max_servers == 0:
            object.__setattr__(self, "max_servers", self.num_servers)
        if self.max_servers < self.num_servers:
            raise ConfigError(
                f"max_servers ({self.max_servers}) is below num_servers ({self.num_servers})"
            )
        if self.num_workers < 1 or self.num_servers < 1:
            raise ConfigError("a job needs at least 1 worker and 1 server")
        if self.chunk_bytes < 64:
            raise ConfigError(f"chunk_bytes must be at least 64, got {self.chunk_bytes}")
        if self.placement not in PLACEMENTS.names():
            raise ConfigError(
                f"unknown placement {self.placement!r}; choose one of {PLACEMENTS.names()}"
            )
        if self.consistency not in CONSISTENCY.names():
            raise ConfigError(
                f"unknown consistency mode {self.consistency!r}; choose one of "
                f"{CONSISTENCY.names()}"
            )
        if self.batching not in BATCHING.names():
            raise ConfigError(
                f"unknown batching {self.batching!r}; choose one of {BATCHING.names()}"
            )
        if self.batching != "equal" and self.consistency != "bsp":
            raise ConfigError(
                f"--batching {self.batching} balances synchronous steps: use it with "
                f"--mode bsp, not {self.consistency}"
            )
        if self.staleness < 0:
            raise ConfigError(f"staleness must be >= 0, got {self.staleness}")
        if self.rebalance_every < 0:
            raise ConfigError(f"rebalance_every must be >= 0, got {self.rebalance_every}")
        moves = self.rebalance_every or is_live(self.placement)
        if (moves or self.max_servers > self.num_servers) and self.consistency != "bsp":
            raise ConfigError(
                "live migration (--placement psld, --max-servers, rebalancing) hands chunks "
                f"over at a synchronous step boundary: use it with --mode bsp, not "
                f"{self.consistency}"
            )
        if self.dead_after_s <= 2 * self.heartbeat_s:
            raise ConfigError("dead_after_s must be more than twice heartbeat_s")
