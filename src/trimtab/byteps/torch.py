"""``byteps.torch`` over trimtab: swap ``import byteps.torch as bps`` for
``import trimtab.byteps.torch as bps`` and run the script under ``trimtab run``.
See :mod:`trimtab.frontend.byteps` for what each name does here."""

from __future__ import annotations

from trimtab.frontend.byteps import (
    Compression,
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
    declare,
    declared,
    init,
    local_rank,
    local_size,
    poll,
    push_pull,
    push_pull_async,
    push_pull_async_inplace,
    push_pull_inplace,
    rank,
    shutdown,
    size,
    synchronize,
)

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "declare",
    "declared",
    "init",
    "local_rank",
    "local_size",
    "poll",
    "push_pull",
    "push_pull_async",
    "push_pull_async_inplace",
    "push_pull_inplace",
    "rank",
    "shutdown",
    "size",
    "synchronize",
]
