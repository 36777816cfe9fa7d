"""Server-side optimizers, taken from the user's torch optimizer.

Where the user's optimizer is element-wise (its update of one element depends only on
that element's gradient and state), a server can run it on each chunk it owns: the
result is the same as running it on whole tensors, and the optimizer state lives with
the chunk, so it can move with it. trimtab runs the user's own torch optimizer class on
each chunk, with the user's hyperparameters, so the arithmetic is torch's, bit for bit.

Other optimizers (LAMB-like per-layer norms, closures, custom classes) run in
*summation* mode: servers aggregate gradients, workers apply their optimizer locally.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from trimtab.errors import ConfigError


class OptimizerMode(str, enum.Enum):
    """Where the optimizer step runs."""

    SERVER = "server"  # servers apply the optimizer to each chunk they own
    SUMMATION = "summation"  # servers aggregate; workers apply their own optimizer


#: torch optimizers whose step is element-wise, so chunks may be updated independently.
ELEMENTWISE: Mapping[str, type[torch.optim.Optimizer]] = {
    "SGD": torch.optim.SGD,
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
    "Adagrad": torch.optim.Adagrad,
    "RMSprop": torch.optim.RMSprop,
    "Adamax": torch.optim.Adamax,
}
#: ... and those for sparse gradients only (an embedding's rows: the row path, see
#: roles/server/rows.py), lazy: each touched row's update its own.
SPARSE_ONLY: Mapping[str, type[torch.optim.Optimizer]] = {"SparseAdam": torch.optim.SparseAdam}
#: Every optimizer a server runs, by class name.
ON_SERVERS: Mapping[str, type[torch.optim.Optimizer]] = {**ELEMENTWISE, **SPARSE_ONLY}

#: Settings about how torch computes (not what): servers choose their own.
_IMPLEMENTATION_KEYS = {"foreach", "fused", "capturable", "differentiable"}


def choose_mode(optimizer: torch.optim.Optimizer, requested: str = "auto") -> OptimizerMode:
    """Pick server or summation mode for ``optimizer``.

    ``requested`` is ``"auto"``, ``"server"`` or ``"summation"``. Raises
    :class:`ConfigError` for ``"server"`` with an optimizer servers cannot run.
    """
    name = type(optimizer).__name__
    supported = name in ON_SERVERS and type(optimizer) is ON_SERVERS.get(name)
    if requested == "auto":
        return OptimizerMode.SERVER if supported else OptimizerMode.SUMMATION
    if requested == "summation":
        return OptimizerMode.SUMMATION
    if requested == "server":
        if not supported:
            raise ConfigError(
                f"servers cannot run {type(optimizer).__name__} on chunks (it is not one of "
                f"{sorted(ON_SERVERS)}); use mode='summation' or mode='auto'"
            )
        return OptimizerMode.SERVER
    raise ConfigError(f"mode must be 'auto', 'server' or 'summation', got {requested!r}")


def hyperparameters(group: Mapping[str, Any]) -> dict[str, Any]:
    """The plain hyperparameters of a torch param group, ready for msgpack."""
    out: dict[str, Any] = {}
    for key, value in group.items():
        if key == "params" or key in _IMPLEMENTATION_KEYS:
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, tuple):
            value = list(value)
        if value is None or isinstance(value, bool | int | float | str | list):
            out[key] = value
    return out


class ChunkOptimizer:
    """A torch optimizer running over one chunk's value.

    Not thread-safe; the owning server's loop calls it.
    """

    def __init__(self, cls_name: str, value: torch.Tensor, hparams: Mapping[str, Any]) -> None:
        if cls_name not in ON_SERVERS:
            raise ConfigError(f"no server-side optimizer {cls_name!r}")
        cls = ON_SERVERS[cls_name]
        self.param = torch.nn.Parameter(value, requires_grad=False)
        accepted = inspect.signature(cls.__init__).parameters
        ctor = {k: _from_wire(v) for k, v in hparams.items() if k in accepted}
        if "foreach" in accepted:
            ctor["foreach"] = False  # one small tensor: the single-tensor path is exact
        self.optimizer = cls([self.param], **ctor)
        # torch wraps a class's step() in a profiler record, a hook runner and a grad-mode
        # switch: 20 to 50 us a call here, more than the update of a small chunk. A
        # server registers no hooks and needs no grad, so it calls the class's own step
        # with grad off: the same arithmetic, bit for bit (tests/unit/test_optim.py).
        self._step = inspect.unwrap(cls.step)
        #: A growing table's chunk: its id -> row map (roles/server/growing.py's
        #: ``Grown``), kept here so that it travels with the optimizer's state.
        self.grown: Any = None
        #: Plain SGD's learning rate (no momentum, weight decay or maximize), else None:
        #: its step is one ``add_``, taken without torch's step and its argument lists.
        self._plain_lr: float | None = None
        self.set_hparams(hparams)

    def set_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Update hyperparameters (e.g. a learning rate a scheduler changed)."""
        group = self.optimizer.param_groups[0]
        for key, value in hparams.items():
            if key not in _IMPLEMENTATION_KEYS:
                group[key] = _from_wire(value)
        self._plain_lr = _plain_sgd_lr(self.optimizer)

    def step(self, grad: torch.Tensor) -> None:
        """Apply one update with ``grad`` (the weighted mean gradient)."""
        lr = self._plain_lr
        if lr is not None and not grad.is_sparse:
            # What torch's single-tensor SGD does with no momentum, weight decay or
            # maximize, bit for bit (tests/unit/test_optim.py), without its ~10 Python
            # calls a step: a chunk's step in the steady state of a job of SGD.
            if torch.is_grad_enabled():
                with torch.no_grad():
                    self.param.add_(grad, alpha=-lr)
            else:  # a server's loop runs with grad off
                self.param.add_(grad, alpha=-lr)
            return
        self.param.grad = grad
        if torch.is_grad_enabled():
            with torch.no_grad():
                self._step(self.optimizer)
        else:  # a server's loop runs with grad off
            self._step(self.optimizer)
        self.param.grad = None

    def step_rows(self, grad: torch.Tensor) -> None:
        """:meth:`step` with a sparse gradient of whole rows (``[rows, width]``, rows
        sparse) of a chunk that holds whole rows: the parameter and its state are seen
        as ``[rows, width]`` views of themselves for the step. torch's sparse optimizers
        (SGD, Adagrad, SparseAdam) are element-wise, so the arithmetic is the same, bit
        for bit, as on the chunk's elements; indexing by row rather than by element
        makes it about 4x faster (1.12 against 0.27 ms for 1,000 rows of 16 in a 4 MiB
        chunk). The state stays the chunk's shape. Never blocks; raises what the
        optimizer's step raises."""
        p, shape = self.param, self.param.shape
        rows = torch.nn.Parameter(p.data.view(grad.shape), requires_grad=False)
        group = self.optimizer.param_groups[0]
        state = self.optimizer.state
        state[rows] = _reshaped(state.pop(p, {}), shape, grad.shape)
        group["params"] = [rows]
        try:
            rows.grad = grad
            if torch.is_grad_enabled():
                with torch.no_grad():
                    self._step(self.optimizer)
            else:
                self._step(self.optimizer)
        finally:
            group["params"] = [p]
            state[p] = _reshaped(state.pop(rows, {}), grad.shape, shape)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()


def _reshaped(state: Mapping[str, Any], old: torch.Size, new: torch.Size) -> dict[str, Any]:
    """A parameter's optimizer state with its tensors of shape ``old`` as views of shape
    ``new`` (the same memory); its other entries (step counts) as they are."""
    return {
        k: v.view(new) if isinstance(v, torch.Tensor) and v.shape == old else v
        for k, v in state.items()
    }


def _plain_sgd_lr(optimizer: torch.optim.Optimizer) -> float | None:
    """``optimizer``'s learning rate if it is torch's SGD whose step is ``p -= lr * g``
    (no momentum, weight decay, maximize, differentiable or tensor ``lr``), else None."""
    if type(optimizer) is not torch.optim.SGD:
        return None
    group = optimizer.param_groups[0]
    lr = group.get("lr")
    if (
        type(lr) is not float
        or group.get("momentum", 0) != 0
        or group.get("weight_decay", 0) != 0
        or group.get("maximize", False)
        or group.get("differentiable", False)
    ):
        return None
    return lr


def _from_wire(value: Any) -> Any:
    # msgpack turns tuples (Adam's betas) into lists; torch wants tuples back.
    return tuple(value) if isinstance(value, list) else value


def warm_up() -> None:
    """Pay torch's one-time cost of a process's first optimizer step (its lazy imports)
    now, not in the middle of a training step or a migration: the step a server takes
    (:meth:`ChunkOptimizer.step`). Blocks."""
    ChunkOptimizer("SGD", torch.zeros(1), {"lr": 0.0, "momentum": 0.9}).step(torch.zeros(1))


def never_compiled() -> int:
    """Tell torch that this process never compiles (a server: it runs optimizers eagerly
    and nothing else), so that the methods torch.optim wraps to keep ``torch.compile``
    out (``add_param_group``, ``state_dict``, ...) do not import ``torch._dynamo`` on
    their first call: 0.75 s of CPU here, in every server of every job, for nothing.
    Each such wrapper keeps its disabled function on the function it wraps, made on
    first use; this sets it to the function itself. Returns how many were set (0 where
    a torch release wraps them otherwise: they then import it as before). Only for a
    process of trimtab's own (``trimtab server``), never a script's. Never blocks."""
    try:
        wrapper = torch._compile._disable_dynamo(lambda: None).__code__
    except AttributeError:  # another torch: its guards stay as they are
        return 0
    marked = 0
    for attr in vars(torch.optim.Optimizer).values():
        fn = getattr(attr, "__wrapped__", None)
        if fn is not None and getattr(attr, "__code__", None) is wrapper:
            setattr(fn, "__dynamo_disable", fn)
            marked += 1
    return marked
