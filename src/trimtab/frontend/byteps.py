"""BytePS's PyTorch names over trimtab, so that a BytePS script runs with its import
swapped: ``import trimtab.byteps.torch as bps`` (or ``from trimtab.byteps import torch
as bps``). ``import trimtab as bps`` gives the same functions, but Horovod's
``DistributedOptimizer`` (which takes no ``staleness=``).

``push_pull`` is :func:`trimtab.allreduce` with Average (``average=True``) or Sum;
``version`` and ``priority`` are accepted and have no effect (trimtab's servers order a
model's own pushes first layers first). ``declare(name)`` needs no declaration here and
only records the name. Staleness (BytePS's pipelined SGD) is the job's consistency in
trimtab: ``trimtab run --mode ssp --staleness S``, not an optimizer argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from trimtab.errors import ConfigError
from trimtab.frontend.api import (
    broadcast_optimizer_state,
    broadcast_parameters,
    init,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from trimtab.frontend.collectives import (
    Handle,
    allreduce,
    allreduce_async,
    allreduce_async_,
    poll,
    synchronize,
)
from trimtab.frontend.compression import Compression
from trimtab.frontend.ops import Average, Sum
from trimtab.frontend.optimizer import DistributedOptimizer as _Optimizer

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

_declared: list[str] = []
#: trimtab's own keywords of its DistributedOptimizer, passed through.
_OPTIMIZER_KEYWORDS = frozenset({"op", "mode", "context", "model"})


def _refuse_staleness(staleness: int) -> None:
    if staleness:
        raise ConfigError(
            f"staleness={staleness}: trimtab bounds staleness for the whole job, not per "
            "optimizer; start it with `trimtab run --mode ssp --staleness "
            f"{staleness} ...` and leave staleness=0 here"
        )


def declare(name: str, **_: Any) -> None:
    """BytePS's ``declare``: trimtab keys each push_pull by its name as it comes, so this
    only records ``name`` (:func:`declared`). Never blocks."""
    if name not in _declared:
        _declared.append(name)


def declared() -> list[str]:
    """The names :func:`declare` was given, in order."""
    return list(_declared)


def push_pull(
    tensor: torch.Tensor,
    average: bool = True,
    name: str | None = None,
    version: int = 0,
    priority: int = 0,
    compression: object = None,
) -> torch.Tensor:
    """``tensor`` averaged (or summed, ``average=False``) over every worker, as a new
    tensor. Blocks until every worker called it with the same ``name`` (BytePS requires
    one; without, calls are matched in order). Raises as :func:`trimtab.allreduce`."""
    return allreduce(tensor, name=name, compression=compression, op=Average if average else Sum)


def push_pull_async(
    tensor: torch.Tensor,
    average: bool = True,
    name: str | None = None,
    version: int = 0,
    priority: int = 0,
) -> Handle:
    """Start :func:`push_pull`; the handle's result is a new tensor. Returns at once."""
    return allreduce_async(tensor, name=name, op=Average if average else Sum)


def push_pull_async_inplace(
    tensor: torch.Tensor,
    average: bool = True,
    name: str | None = None,
    version: int = 0,
    priority: int = 0,
    staleness: int = 0,
) -> Handle:
    """Start :func:`push_pull` into ``tensor`` itself. Returns at once. Raises
    :class:`ConfigError` for ``staleness`` > 0 (see the module's docstring)."""
    _refuse_staleness(staleness)
    return allreduce_async_(tensor, name=name, op=Average if average else Sum)


def push_pull_inplace(
    tensor: torch.Tensor,
    average: bool = True,
    name: str | None = None,
    version: int = 0,
    priority: int = 0,
    staleness: int = 0,
) -> torch.Tensor:
    """:func:`push_pull` into ``tensor`` itself, which is returned. Blocks."""
    handle = push_pull_async_inplace(tensor, average, name, version, priority, staleness)
    result: torch.Tensor = synchronize(handle)
    return result


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
    compression: object = None,
    backward_passes_per_step: int = 1,
    staleness: int = 0,
    **kwargs: Any,
) -> _Optimizer:
    """trimtab's :class:`~trimtab.DistributedOptimizer` under BytePS's keywords. Raises
    :class:`ConfigError` for ``staleness`` > 0 (start the job with ``--mode ssp``) and
    for keywords neither BytePS's nor trimtab's."""
    _refuse_staleness(staleness)
    unknown = sorted(set(kwargs) - _OPTIMIZER_KEYWORDS)
    if unknown:
        raise ConfigError(
            f"DistributedOptimizer got keywords it does not know: {unknown}; it takes "
            "named_parameters, compression, backward_passes_per_step, staleness (0) and "
            f"trimtab's {sorted(_OPTIMIZER_KEYWORDS)}"
        )
    return _Optimizer(
        optimizer,
        named_parameters=named_parameters,
        compression=compression,
        backward_passes_per_step=backward_passes_per_step,
        **kwargs,
    )
