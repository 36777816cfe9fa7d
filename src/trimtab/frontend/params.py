"""Which tensors a DistributedOptimizer trains, under which names, and how gradients
combine over workers (Horovod's ``op=``). Nothing here blocks or talks to anyone."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from trimtab.errors import ConfigError
from trimtab.frontend import ops
from trimtab.frontend.tables import is_table
from trimtab.roles.server.optim import OptimizerMode
from trimtab.runtime.tensors import wire_dtype

log = logging.getLogger("trimtab")

_said_mode: set[str] = set()

#: Horovod's warning, word for word (what users grep for): step() without
#: skip_synchronize() after synchronize().
RESYNC_WARNING = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
    "your code."
)


#: Horovod's reduction ops by their enum values (``hvd.Average`` is 0, ``hvd.Sum`` 1).
def reduce_op(op: object) -> str:
    """``"average"`` or ``"sum"`` for ``op``, read as
    :func:`trimtab.frontend.ops.reduce_op` reads it (None, Horovod's ints, names, enum
    members, objects with a ``name``). Raises :class:`ConfigError` for Adasum, for the
    other collectives' ops (Min, Max, Product) and anything else."""
    chosen = ops.reduce_op(op)
    if chosen not in (ops.Average, ops.Sum):
        raise ConfigError(f"the optimizer's op must be Average or Sum, got {op!r}")
    return chosen.value


def reduction(op: object, predivide: object) -> tuple[str, float]:
    """``op`` as :func:`reduce_op` reads it, and ``gradient_predivide_factor`` as a
    float. Raises :class:`ConfigError` as :func:`reduce_op` does, for a factor that is
    not positive, or one other than 1 with op=Sum (as Horovod does)."""
    name = reduce_op(op)
    factor = float(predivide)  # type: ignore[arg-type]
    if not factor > 0:
        raise ConfigError(f"gradient_predivide_factor must be positive, got {factor}")
    if factor != 1.0 and name != "average":
        raise ConfigError("gradient_predivide_factor is supported with op=Average only")
    return name, factor


def say_mode(optimizer: torch.optim.Optimizer, mode: OptimizerMode) -> None:
    """Log, once per optimizer class and process, where its step runs."""
    cls = type(optimizer).__name__
    if cls not in _said_mode:
        _said_mode.add(cls)
        where = (
            "servers apply it to each chunk"
            if mode is OptimizerMode.SERVER
            else "servers sum gradients, each worker applies it"
        )
        log.info("trimtab: %s runs in %s mode (%s)", cls, mode.value, where)


def trained(p: torch.Tensor) -> bool:
    """Whether an optimizer's tensor ``p`` is trained: a non-float tensor that needs no
    gradient (a step counter, an index table) is not, and is neither declared nor
    pushed."""
    return p.requires_grad or p.is_floating_point() or p.is_complex()


def name_params(
    groups: Sequence[dict[str, Any]], named: Iterable[tuple[str, torch.Tensor]] | None
) -> list[tuple[str, torch.Tensor, int]]:
    """``(name, tensor, group index)`` of every trained tensor of the param ``groups``,
    named by ``named`` (``model.named_parameters()``), else by place. Raises
    :class:`ConfigError` for duplicate names, an unnamed, sparse, non-contiguous or
    untransportable parameter."""
    group_of = {p: g for g, group in enumerate(groups) for p in group["params"] if trained(p)}
    if named is None:
        pairs = [
            (f"group{g}.param{i}", p)
            for g, group in enumerate(groups)
            for i, p in enumerate(group["params"])
        ]
    else:
        pairs = list(named)
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ConfigError("named_parameters has duplicate names; names must be unique")
    out = []
    seen = set()
    for name, p in pairs:
        if p not in group_of or p in seen:
            continue  # not optimized (e.g. frozen) or shared under two names
        seen.add(p)
        if p.is_sparse or not (p.is_contiguous() or is_table(p)):
            raise ConfigError(f"parameter {name!r} must be dense and contiguous")
        try:
            wire_dtype(p.dtype)
        except ConfigError as exc:
            raise ConfigError(
                f"parameter {name!r}: {exc}; leave it out of the optimizer (a buffer, "
                "or requires_grad=False) or make it floating-point"
            ) from None
        out.append((name, p, group_of[p]))
    missing = [p for p in group_of if p not in seen]
    if missing:
        raise ConfigError(
            f"{len(missing)} optimized parameters are not in named_parameters; pass "
            "model.named_parameters() for the model the optimizer was built on"
        )
    return out
