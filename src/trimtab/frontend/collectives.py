"""Horovod's collectives of tensors and objects: ``allreduce``, ``allgather``,
``broadcast`` (each also ``_async``, and in place with ``_``), ``allgather_object``,
``broadcast_object``, ``join``, ``poll`` and ``synchronize``.

They are meant for small tensors and objects (metrics, a learning rate, a batch's
sample count), beside the optimizer's parameter server path. Each is one gather through
the coordinator (:meth:`Context.gather`): every worker sends its part, gets every
worker's parts back in rank order, and reduces them itself, in rank order, so that each
worker computes the very same bits (and bfloat16, which numpy lacks, is no exception).

As in Horovod, a collective with no ``name`` is keyed by a per-process count, so every
worker must call them in the same order; with a ``name``, in any order. Where workers
disagree (dtype, shape, op, root, or one calls another collective), every worker gets a
:class:`~trimtab.RemoteError` with code ``mismatch`` that quotes each rank's call, never a
hang. Unlike Horovod's, results are not differentiable (they are computed without
autograd), and ``join()`` does not let other workers' collectives go on without the
joined worker: it is a barrier that returns the rank that arrived last.

Integer results keep their dtype: sums wrap as MPI's do, ``Average`` is the floor of the
mean (Horovod's PyTorch behaviour, horovod/horovod#2054), and ``prescale_factor`` /
``postscale_factor`` on integers multiply in float64 and truncate toward zero.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from typing import Any

import torch

from trimtab.errors import ConfigError
from trimtab.frontend.api import default_context
from trimtab.frontend.compression import compressor
from trimtab.frontend.ops import ReduceOp, reduce_op
from trimtab.roles.worker.context import Context, Gathered
from trimtab.runtime.tensors import as_bytes

__all__ = [
    "Handle",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "join",
    "poll",
    "synchronize",
]

_HALF = (torch.float16, torch.bfloat16)


class Handle:
    """A collective in flight, as the ``*_async`` functions return it: :func:`poll`
    says whether it is done, :func:`synchronize` waits and returns its result. Not
    thread-safe: wait for it on one thread."""

    def __init__(self, ctx: Context, future: Any, finish: Callable[[Gathered], Any]) -> None:
        self._ctx = ctx
        self._future = future
        self._finish: Callable[[Gathered], Any] | None = finish
        self._result: Any = None

    def poll(self) -> bool:
        """Whether the result is in (:meth:`wait` will not block). Never blocks."""
        return self._finish is None or bool(self._future.done())

    def wait(self) -> Any:
        """The collective's result. Blocks until every worker took part; raises
        :class:`~trimtab.RemoteError` if they disagreed, :class:`~trimtab.JobAborted` or
        :class:`~trimtab.NodeTimeout`."""
        if self._finish is not None:
            finish, self._finish = self._finish, None
            self._result = finish(self._ctx.gathered(self._future))
        return self._result


def poll(handle: Handle) -> bool:
    """Whether ``handle``'s collective is done (Horovod's ``poll``). Never blocks."""
    return handle.poll()


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle``'s collective and return its result (the output tensor).
    Blocks; raises as :meth:`Handle.wait`."""
    return handle.wait()


# -- tensors on the wire ------------------------------------------------------------------


def _check_process_set(process_set: object) -> None:
    if process_set is not None:
        raise ConfigError(
            "trimtab has one process set (every worker): pass process_set=None "
            f"(got {process_set!r})"
        )


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().cpu()


def _wire(tensor: torch.Tensor) -> list[memoryview]:
    """A contiguous CPU tensor's bytes, as one frame (none for an empty tensor)."""
    return [as_bytes(tensor)] if tensor.numel() else []


def _tensor(frames: list[memoryview], dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``shape`` from a part's frames (copied: the frames are the socket's)."""
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    raw = bytearray(frames[0])
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def _scaled(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``tensor * factor`` in its own dtype (integers: in float64, truncated)."""
    if factor == 1.0:
        return tensor
    if tensor.is_floating_point():
        return tensor * factor
    return (tensor.double() * factor).trunc().to(tensor.dtype)


def _combine(parts: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """Reduce the workers' tensors, in rank order, keeping their dtype (half precision
    is accumulated in float32)."""
    dtype = parts[0].dtype
    stacked = torch.stack(parts)
    if dtype in _HALF:
        stacked = stacked.float()
    if op is ReduceOp.MIN:
        out = stacked.amin(0)
    elif op is ReduceOp.MAX:
        out = stacked.amax(0)
    elif op is ReduceOp.PRODUCT:
        out = stacked.prod(0, dtype=stacked.dtype)
    else:
        out = stacked.sum(0, dtype=stacked.dtype)
        if op is ReduceOp.AVERAGE:
            if out.is_floating_point():
                out = out / len(parts)
            else:
                out = torch.div(out, len(parts), rounding_mode="floor")
    return out.to(dtype)


# -- allreduce ----------------------------------------------------------------------------


def _allreduce_async(
    tensor: torch.Tensor,
    output: torch.Tensor | None,
    name: str | None,
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
) -> Handle:
    if tensor.dtype is torch.bool:
        raise ConfigError("allreduce of a bool tensor: cast it to torch.uint8 (or int) first")
    ctx = default_context()
    host = _scaled(_host(tensor), prescale_factor).contiguous()
    shape, dtype, device = tuple(tensor.shape), tensor.dtype, tensor.device
    sig = f"allreduce op={op.value} {dtype} shape={list(shape)}"
    future = ctx.gather(name, sig, {}, _wire(host))

    def finish(got: Gathered) -> torch.Tensor:
        parts = [_tensor(f, dtype, shape) for f in got.frames]
        return _into(_scaled(_combine(parts, op), postscale_factor).to(device), output)

    return Handle(ctx, future, finish)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: object = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: object = None,
) -> Handle:
    """Start reducing ``tensor`` over every worker (``op``: Average by default; Sum,
    Min, Max, Product; ``average=`` is Horovod's deprecated bool); its result is a new
    tensor. ``prescale_factor`` multiplies this worker's tensor before the reduction,
    ``postscale_factor`` the result. Returns a :class:`Handle` at once (the tensor is
    read now). Raises :class:`ConfigError` for Adasum, a bool tensor or a process set."""
    _check_process_set(process_set)
    chosen = reduce_op(op, average)
    return _allreduce_async(tensor, None, name, chosen, prescale_factor, postscale_factor)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: object = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: object = None,
) -> Handle:
    """:func:`allreduce_async`, the result written into ``tensor`` when synchronized."""
    _check_process_set(process_set)
    chosen = reduce_op(op, average)
    return _allreduce_async(tensor, tensor, name, chosen, prescale_factor, postscale_factor)


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: object = None,
    op: object = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: object = None,
) -> torch.Tensor:
    """``tensor`` reduced over every worker, as a new tensor of its shape and dtype
    (``tensor`` is unchanged). ``compression`` (``trimtab.Compression.fp16``, ...)
    narrows it on the wire, as Horovod's does. Blocks until every worker called it;
    raises as :func:`allreduce_async` and :meth:`Handle.wait`."""
    wire = compressor(compression)
    compressed, state = wire.compress(tensor)
    handle = allreduce_async(
        compressed, average, name, op, prescale_factor, postscale_factor, process_set
    )
    result: torch.Tensor = wire.decompress(handle.wait(), state)
    return result


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: object = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: object = None,
) -> torch.Tensor:
    """:func:`allreduce` in place: ``tensor`` holds the result, and is returned. Blocks."""
    handle = allreduce_async_(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )
    result: torch.Tensor = handle.wait()
    return result


# -- allgather ----------------------------------------------------------------------------


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: object = None
) -> Handle:
    """Start concatenating every worker's ``tensor`` along dimension 0, in rank order:
    their first dimensions may differ, the rest of the shape and the dtype may not (a
    0-d tensor counts as one element). Returns a :class:`Handle` at once."""
    _check_process_set(process_set)
    ctx = default_context()
    host = _host(tensor).reshape(1) if tensor.dim() == 0 else _host(tensor)
    rest, dtype, device = tuple(host.shape[1:]), tensor.dtype, tensor.device
    sig = f"allgather {dtype} shape=[*, {', '.join(map(str, rest))}]"
    future = ctx.gather(name, sig, {"d": int(host.shape[0])}, _wire(host))

    def finish(got: Gathered) -> torch.Tensor:
        parts = [
            _tensor(f, dtype, (int(m["d"]), *rest))
            for m, f in zip(got.metas, got.frames, strict=True)
        ]
        return torch.cat(parts).to(device)

    return Handle(ctx, future, finish)


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: object = None
) -> torch.Tensor:
    """Every worker's ``tensor`` concatenated along dimension 0, in rank order (see
    :func:`allgather_async`). Blocks until every worker called it."""
    result: torch.Tensor = allgather_async(tensor, name, process_set).wait()
    return result


def allgather_object(obj: Any, name: str | None = None, process_set: object = None) -> list[Any]:
    """Every worker's ``obj`` (pickled), as a list by rank. Blocks until every worker
    called it. Unpickles what the job's other workers sent: trust them as yourself."""
    _check_process_set(process_set)
    ctx = default_context()
    raw = pickle.dumps(obj)
    got = ctx.gathered(ctx.gather(name, "allgather_object", {}, [raw]))
    return [pickle.loads(bytes(f[0])) for f in got.frames]


# -- broadcast ----------------------------------------------------------------------------


def _check_root(ctx: Context, root_rank: int) -> None:
    if not 0 <= root_rank < ctx.size:
        raise ConfigError(
            f"root_rank {root_rank} is not a worker rank: pass one of 0..{ctx.size - 1}"
        )


def _broadcast_async(
    tensor: torch.Tensor, output: torch.Tensor | None, root_rank: int, name: str | None
) -> Handle:
    ctx = default_context()
    _check_root(ctx, root_rank)
    shape, dtype, device = tuple(tensor.shape), tensor.dtype, tensor.device
    sig = f"broadcast root={root_rank} {dtype} shape={list(shape)}"
    frames = _wire(_host(tensor)) if ctx.rank == root_rank else []
    future = ctx.gather(name, sig, {}, frames)

    def finish(got: Gathered) -> torch.Tensor:
        return _into(_tensor(got.frames[root_rank], dtype, shape).to(device), output)

    return Handle(ctx, future, finish)


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: object = None
) -> Handle:
    """Start giving every worker worker ``root_rank``'s ``tensor``, as a new tensor.
    Returns a :class:`Handle` at once. Raises :class:`ConfigError` for a root that is no
    worker's rank."""
    _check_process_set(process_set)
    return _broadcast_async(tensor, None, root_rank, name)


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: object = None
) -> Handle:
    """:func:`broadcast_async`, written into ``tensor`` when synchronized."""
    _check_process_set(process_set)
    return _broadcast_async(tensor, tensor, root_rank, name)


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: object = None
) -> torch.Tensor:
    """Worker ``root_rank``'s ``tensor``, as a new tensor on every worker. Blocks until
    every worker called it. (A model's parameters: :func:`trimtab.broadcast_parameters`,
    which also updates the servers.)"""
    result: torch.Tensor = broadcast_async(tensor, root_rank, name, process_set).wait()
    return result


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: object = None
) -> torch.Tensor:
    """:func:`broadcast` in place: ``tensor`` holds the root's value, and is returned."""
    result: torch.Tensor = broadcast_async_(tensor, root_rank, name, process_set).wait()
    return result


def broadcast_object(
    obj: Any = None, root_rank: int = 0, name: str | None = None, process_set: object = None
) -> Any:
    """Worker ``root_rank``'s ``obj`` (pickled) on every worker; the root gets its own
    ``obj`` back. Blocks until every worker called it."""
    _check_process_set(process_set)
    ctx = default_context()
    _check_root(ctx, root_rank)
    frames = [pickle.dumps(obj)] if ctx.rank == root_rank else []
    got = ctx.gathered(ctx.gather(name, f"broadcast_object root={root_rank}", {}, frames))
    return obj if ctx.rank == root_rank else pickle.loads(bytes(got.frames[root_rank][0]))


# -- join ---------------------------------------------------------------------------------


def join(device: int = -1) -> int:
    """Wait for every worker to call ``join()``; return the rank that called it last
    (Horovod's answer). trimtab has no uneven-data support: until every worker joined,
    the others must not call collectives (they would be refused as a mismatch), so
    ``join`` is a barrier. ``device`` is accepted for Horovod's signature. Blocks."""
    ctx = default_context()
    return ctx.gathered(ctx.gather(None, "join", {})).last


def _into(result: torch.Tensor, output: torch.Tensor | None) -> torch.Tensor:
    """``result``, or ``output`` holding it (an in-place collective's tensor)."""
    if output is None:
        return result
    with torch.no_grad():
        output.copy_(result)
    return output
