"""What a simulated run leaves: its steps' times and sizes, and the decisions that
changed the job. Plain records; no logic."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Decision", "Trace"]


@dataclasses.dataclass(frozen=True)
class Decision:
    """One decision that changed the job: ``kind`` (``migration``, ``server_wanted``,
    ``server_joined``, ``server_retired``, ``worker_lost``, ``worker_joined``) at step
    boundary ``clock``, simulated second ``at``, with what it did (``detail``)."""

    kind: str
    clock: int
    at: float
    detail: dict[str, Any]


@dataclasses.dataclass
class Trace:
    """What a run leaves: per step, when it started (its first worker) and ended (its
    last), worker 0's end, the batch sizes' least and most, the map's epoch in force;
    the decisions."""

    starts: list[float] = dataclasses.field(default_factory=list)
    ends: list[float] = dataclasses.field(default_factory=list)
    worker0_ends: list[float] = dataclasses.field(default_factory=list)
    batch_min: list[int] = dataclasses.field(default_factory=list)
    batch_max: list[int] = dataclasses.field(default_factory=list)
    epochs: list[int] = dataclasses.field(default_factory=list)
    #: Steps during which the workers learned a new map's epoch, not yet in force: a
    #: migration cut at the step's round (its pushes answered *moved*; the workers fetch
    #: the map then). A real worker's record of the epoch it routes by shows it there.
    learned: dict[int, int] = dataclasses.field(default_factory=dict)
    #: Every worker's batch size at each step, in jobs of at most 16 workers.
    batches: list[list[int]] = dataclasses.field(default_factory=list)
    decisions: list[Decision] = dataclasses.field(default_factory=list)
    #: Each map's epoch and owners, in jobs of at most 1,024 chunks (epoch 0 the first).
    maps: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    #: Per server, PSLD's figures as the coordinator took them, in jobs of at most 16
    #: servers: each step's worker bounds (lower, upper) and busy window (bytes/s).
    bounds: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    #: The step of each of ``bounds``' figures (a server without chunks has none).
    bound_clocks: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    windows: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    sizes_last: list[int] = dataclasses.field(default_factory=list)
    bytes_moved: int = 0
    migrations: int = 0
