"""Horovod's reduction operations: ``trimtab.Average``, ``trimtab.Sum``, ``trimtab.Min``,
``trimtab.Max``, ``trimtab.Product`` and (refused) ``trimtab.Adasum``.

Torch-free, so that the optimizer, the collectives and the launcher can all name them.
"""

from __future__ import annotations

import enum

from trimtab.errors import ConfigError

__all__ = ["Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum", "reduce_op"]


class ReduceOp(str, enum.Enum):
    """How an allreduce combines the workers' tensors. ``str(op)`` is its value
    (``"average"``, ...), so that code comparing names keeps working."""

    AVERAGE = "average"
    SUM = "sum"
    ADASUM = "adasum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"

    def __str__(self) -> str:
        return self.value


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

#: Horovod's integer values of its ops (``hvd.Average`` is 0 in some of its versions).
_HOROVOD_INTS = {0: ReduceOp.AVERAGE, 1: ReduceOp.SUM, 2: ReduceOp.ADASUM}


def reduce_op(op: object = None, average: bool | None = None) -> ReduceOp:
    """The operation Horovod's ``op=`` and deprecated ``average=`` arguments ask for:
    ``op`` (a :class:`ReduceOp`; its name in any case, ``"ReduceOp.SUM"`` or
    ``"Op.Sum"`` too; an object whose ``name`` is one; Horovod's ints 0, 1, 2) if given,
    else Average, or Sum for ``average=False``. Never blocks.

    Raises :class:`ConfigError` for both arguments at once, for an unknown ``op``, and for
    Adasum (trimtab reduces exactly, by sum: use Average or Sum)."""
    if op is not None and average is not None:
        raise ConfigError(
            "pass op= or the deprecated average=, not both: op=trimtab.Average or op=trimtab.Sum"
        )
    if op is None:
        return ReduceOp.SUM if average is False else ReduceOp.AVERAGE
    if isinstance(op, ReduceOp):
        chosen = op
    elif isinstance(op, int) and not isinstance(op, bool) and op in _HOROVOD_INTS:
        chosen = _HOROVOD_INTS[op]
    else:
        try:
            name = str(getattr(op, "name", None) or op)
            chosen = ReduceOp(name.lower().rsplit(".", 1)[-1])
        except ValueError:
            known = ", ".join(f"trimtab.{o.value.capitalize()}" for o in ReduceOp)
            raise ConfigError(f"unknown reduction op {op!r}; use one of {known}") from None
    if chosen is ReduceOp.ADASUM:
        raise ConfigError(
            "op=Adasum is not supported by trimtab (it has no adaptive summation): "
            "use op=trimtab.Average or op=trimtab.Sum"
        )
    return chosen
