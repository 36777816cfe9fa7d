"""Consistency policies: when a chunk's pushed gradients become an update.

A policy is pure: the server asks it how to weight each push and when the gradients it
holds for a chunk are complete. BSP is here; ASP, SSP and SaPS implement the same
interface.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Collection
from typing import ClassVar

from trimtab._registry import Registry


@dataclasses.dataclass(frozen=True)
class PushInfo:
    """What a server knows about one push when it arrives.

    Attributes:
        worker: the pushing worker's rank.
        clock: the worker's clock (iterations it has completed).
        weight: the worker's batch size for this step (or 1.0 if not given).
        version_read: the chunk version the gradient was computed from.
        version_now: the chunk's version at the server.
    """

    worker: int
    clock: int
    weight: float
    version_read: int
    version_now: int


class ConsistencyPolicy(abc.ABC):
    """Decides how pushes combine into updates. Pure; no I/O."""

    name: ClassVar[str]

    @abc.abstractmethod
    def weight(self, push: PushInfo) -> float | None:
        """The weight of this gradient in the update, or ``None`` to drop it."""

    @abc.abstractmethod
    def ready(self, arrived: Collection[int], active: Collection[int]) -> bool:
        """Whether the gradients from ``arrived`` workers make an update now."""


CONSISTENCY: Registry[ConsistencyPolicy] = Registry("consistency")


@CONSISTENCY.register("bsp")
class Bsp(ConsistencyPolicy):
    """Bulk synchronous: a chunk is updated once every active worker's gradient for the
    clock is in; each gradient weighs its worker's batch size (over the global batch)."""

    name = "bsp"

    def weight(self, push: PushInfo) -> float | None:
        return push.weight

    def ready(self, arrived: Collection[int], active: Collection[int]) -> bool:
        return all(w in arrived for w in active)
