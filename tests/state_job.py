"""The jobs of the optimizer-state and Horovod-recipe tests, and their one-process
references (plain torch over the same global batches).

``recipe``: ``plain`` (backward, step), ``clip`` (synchronize, clip_grad_norm_, step in
skip_synchronize), ``amp`` (Horovod's mixed-precision recipe with a CPU GradScaler).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tests.equivalence_job import GLOBAL_BATCH, global_batches, loss_of, make_model

#: Each optimizer under test, with hyperparameters of every type torch uses.
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.95), amsgrad=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05),
    "adamax": lambda ps: torch.optim.Adamax(ps, lr=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01),
}

CLIP = 0.05  # small enough to bite every step


def backward_and_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    recipe: str,
    scaler: torch.amp.GradScaler | None,
    distributed: bool,
) -> None:
    """One step of ``recipe`` (Horovod's form when ``distributed``)."""
    opt.zero_grad()
    loss = loss_of(model, x, y)
    if recipe == "amp":
        assert scaler is not None
        scaler.scale(loss).backward()
        if distributed:
            opt.synchronize()  # type: ignore[attr-defined]
        scaler.unscale_(opt)
        if distributed:
            with opt.skip_synchronize():  # type: ignore[attr-defined]
                scaler.step(opt)
        else:
            scaler.step(opt)
        scaler.update()
        return
    loss.backward()
    if recipe == "clip":
        if distributed:
            opt.synchronize()  # type: ignore[attr-defined]
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        if distributed:
            with opt.skip_synchronize():  # type: ignore[attr-defined]
                opt.step()
            return
    opt.step()


def reference(name: str, steps: int, recipe: str = "plain") -> list[torch.Tensor]:
    """One process, plain torch, over the first ``steps`` global batches."""
    model = make_model()
    opt = OPTIMIZERS[name](model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if recipe == "amp" else None
    for x, y in global_batches(steps):
        backward_and_step(model, opt, x, y, recipe, scaler, distributed=False)
    return [p.detach().clone() for p in model.parameters()]


def train(
    opt: torch.optim.Optimizer,
    model: torch.nn.Module,
    rank: int,
    size: int,
    steps: range,
    recipe: str = "plain",
) -> None:
    """Worker ``rank`` of ``size`` (equal slices of each global batch) runs ``steps``."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if recipe == "amp" else None
    share = GLOBAL_BATCH // size
    batches = global_batches(steps.stop)
    for step in steps:
        x, y = batches[step]
        lo = rank * share
        sl = slice(lo, lo + share)
        backward_and_step(model, opt, x[sl], y[sl], recipe, scaler, distributed=True)
