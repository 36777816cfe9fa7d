"""``DistributedOptimizer(model=...)``: the next forward overlaps the step's communication.

With a model, ``step()`` returns once the last gradients are sent, and each module's
forward waits only for its own parameters' new values (P3, BytePS's cross-barrier).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from trimtab.frontend.pusher import Pusher


def hook_forward(model: torch.nn.Module, pusher: Pusher) -> list[Any]:
    """Make each module of ``model`` wait, before its forward, for the values of its own
    parameters among ``pusher``'s; and the model's ``state_dict()`` and the end of its
    forward for all of them. Returns the hooks' handles. Never blocks (the hooks do)."""
    hooks = []
    for module in model.modules():
        own: list[torch.Tensor] = [
            p for p in module.parameters(recurse=False) if p in pusher.chunks_of
        ]
        if own:
            wait_own = functools.partial(_before_forward, pusher, own)
            hooks.append(module.register_forward_pre_hook(wait_own))
    hooks.append(
        model.register_state_dict_pre_hook(  # type: ignore[no-untyped-call]
            lambda *_: pusher.drain()
        )
    )
    # Once the whole forward has run, what has not arrived yet (parameters whose
    # module's forward did not run, read outside forward: a penalty in the loss, say)
    # is waited for, so nothing older than the step is read after forward.
    hooks.append(model.register_forward_hook(lambda *_: pusher.drain()))
    return hooks


def _before_forward(
    pusher: Pusher, params: list[torch.Tensor], module: object, args: object
) -> None:
    if pusher.arriving:
        pusher.arrive(params)
