"""``.grad`` after ``step()`` in server mode: the mean gradient, as under Horovod, fetched
when a script reads it.

Under Horovod (and BytePS) every rank's ``.grad`` holds the allreduced gradient after
``step()``. In server mode the workers never need it: the servers merged the gradients
and sent back updated values. Sending the mean back beside every value would double the
answers' bytes on every step of every job, for the few scripts that read ``.grad`` after
``step()`` (a gradient-accumulation check, a norm logged). So the servers keep the
mean each round applied (:func:`~trimtab.roles.server.store.keep_mean`: no copy), and a
worker asks for it only when its script reads ``.grad``:

- At construction, a server-mode :class:`~trimtab.DistributedOptimizer` makes each of
  its ``nn.Parameter`` objects a :class:`MeanGradParameter` (the same object: its class
  is swapped, ``isinstance(p, nn.Parameter)`` holds, nothing is copied), whose ``grad``
  property first fills in an owed mean. :meth:`~trimtab.DistributedOptimizer.close`
  swaps them back.
- After each server-mode step, the optimizer marks every parameter's mean owed
  (:func:`owe`). Reading ``p.grad`` (the script, ``clip_grad_norm_``, a logger) fetches
  it (one PULL per chunk, with ``gm``); ``zero_grad()`` and assigning ``p.grad`` forget
  it; the next backward fetches it before it adds to ``.grad`` where ``.grad`` is kept
  (no ``zero_grad()`` between steps: Horovod's gradient then adds to the mean).

A parameter whose class cannot be swapped (a subclass of ``nn.Parameter``, a plain tensor
with ``requires_grad``) gets its mean at the end of the step instead (one round trip).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from trimtab.errors import RemoteError
from trimtab.frontend.pusher import Pusher
from trimtab.frontend.tables import is_table
from trimtab.protocol import headers
from trimtab.protocol.headers import ValueHeader
from trimtab.protocol.messages import ErrorCode
from trimtab.roles.worker.replies import Reply
from trimtab.runtime.tensors import tensor_from

log = logging.getLogger("trimtab")

#: The parameters whose mean gradient is owed, by ``id``: what fetches it into ``.grad``.
_owed: dict[int, Callable[[torch.Tensor], None]] = {}

#: The tensor's own ``grad`` attribute (a getset descriptor of ``torch._C.TensorBase``).
_grad: Any = inspect.getattr_static(torch.Tensor, "grad")


def raw_grad(p: torch.Tensor) -> torch.Tensor | None:
    """``p.grad`` as autograd left it, without fetching an owed mean. Never blocks."""
    return _grad.__get__(p)  # type: ignore[no-any-return]


def set_raw_grad(p: torch.Tensor, value: torch.Tensor | None) -> None:
    """Set ``p.grad`` without forgetting an owed mean. Never blocks."""
    _grad.__set__(p, value)


class MeanGradParameter(nn.Parameter):
    """An ``nn.Parameter`` of a server-mode DistributedOptimizer: reading ``grad`` first
    fills in the mean gradient its last step applied, where one is owed (blocks for
    one round trip per chunk then; raises as the fetch does). Never constructed: a
    parameter's class is swapped to it (:func:`adopt`)."""

    @property
    def grad(self) -> torch.Tensor | None:
        fetch = _owed.pop(id(self), None)
        if fetch is not None:
            fetch(self)
        return _grad.__get__(self)  # type: ignore[no-any-return]

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:
        _owed.pop(id(self), None)
        _grad.__set__(self, value)

    @grad.deleter
    def grad(self) -> None:
        _owed.pop(id(self), None)
        _grad.__delete__(self)


def adopt(p: torch.Tensor) -> bool:
    """Make ``p`` a :class:`MeanGradParameter` if it is exactly an ``nn.Parameter``;
    whether it is one now. Never blocks."""
    if type(p) is nn.Parameter:
        p.__class__ = MeanGradParameter
    return type(p) is MeanGradParameter


def release(p: torch.Tensor) -> None:
    """Forget what ``p`` is owed and give it back its class. Never blocks."""
    _owed.pop(id(p), None)
    if type(p) is MeanGradParameter:
        p.__class__ = nn.Parameter  # type: ignore[assignment]


def owe(p: torch.Tensor, fetch: Callable[[torch.Tensor], None]) -> None:
    """``p``'s next ``grad`` read calls ``fetch(p)`` first. Never blocks."""
    _owed[id(p)] = fetch


def forget(p: torch.Tensor) -> None:
    """``p`` is owed nothing (its ``.grad`` was cleared or replaced). Never blocks."""
    _owed.pop(id(p), None)


def settle(p: torch.Tensor) -> None:
    """Fetch what ``p`` is owed now, if anything. Blocks as the fetch does."""
    fetch = _owed.pop(id(p), None)
    if fetch is not None:
        fetch(p)


def owed(p: torch.Tensor) -> bool:
    """Whether ``p``'s mean gradient is owed. Never blocks."""
    return id(p) in _owed


def _sparse(grad: torch.Tensor | None) -> bool:
    return grad is not None and grad.is_sparse


class MeanGrads:
    """The mean gradients a server-mode optimizer under BSP owes its parameters' ``.grad``
    (the module's docstring says how). Holds a hook on each parameter whose class it
    swapped, until :meth:`close`.
    Not thread-safe: the training thread uses it."""

    def __init__(self, pusher: Pusher) -> None:
        self._pusher = pusher
        self._lazy: list[torch.Tensor] = []
        self._eager: list[torch.Tensor] = []
        self._hooks = []
        for p in pusher.chunks_of:
            if is_table(p):  # its .grad stays this worker's own (sparse) gradient
                continue
            if not adopt(p):
                self._eager.append(p)  # (fetched at the step's end: never owed, no hook)
                continue
            self._lazy.append(p)
            self._hooks.append(p.register_hook(self._settle_before(p)))  # type: ignore[no-untyped-call]

    def stepped(self) -> None:
        """A server-mode step was taken: each parameter's ``.grad`` is owed its mean
        (fetched now for those whose class stays: blocks for them)."""
        for p in self._lazy:
            if not _sparse(raw_grad(p)):  # a sparse .grad stays this worker's own
                owe(p, self.fetch)
        for p in self._eager:
            if not _sparse(p.grad):
                self.fetch(p)

    def forget(self) -> None:
        """The gradients are cleared (``zero_grad()``): nothing is owed. Never blocks."""
        for p in self._lazy:
            forget(p)

    def close(self) -> None:
        """Take the hooks off, give the parameters back their class; what is owed is
        forgotten. Never raises."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for p in self._lazy:
            release(p)
        self._lazy.clear()
        self._eager.clear()

    def fetch(self, p: torch.Tensor) -> None:
        """``p.grad`` := the mean gradient of the step just taken. Blocks (a round trip
        per chunk); where a server no longer holds it (the chunk moved, or a backup took
        over), logs a warning and leaves ``.grad`` this worker's own. Raises as
        :meth:`Pusher.ask` otherwise."""
        try:
            replies = self._ask(p)
        except RemoteError as exc:
            if exc.code != ErrorCode.BAD_STATE.value:
                raise
            log.warning(
                "trimtab: .grad of a parameter of shape %s keeps this worker's own "
                "gradient, not the mean over workers: %s",
                tuple(p.shape),
                exc,
            )
            return
        grad = raw_grad(p)
        # Written in place, one copy, where .grad is a CPU tensor laid out as p; else
        # through a tensor of its own.
        direct = (
            grad is not None
            and grad.device.type == "cpu"
            and grad.dtype == p.dtype
            and grad.is_contiguous()
        )
        with torch.no_grad():
            if direct and grad is not None:
                flat = grad.view(-1)
            else:
                flat = torch.empty(p.numel(), dtype=p.dtype)
            for c, reply in zip(self._pusher.chunks_of[p], replies, strict=True):
                h = cast(ValueHeader, reply.header)  # a VALUE, read as Pusher.arrive does
                piece = flat[c.offset : c.offset + c.numel]
                if h.get("z"):  # no worker had a gradient: Horovod's zero-filled mean
                    piece.zero_()
                else:
                    piece.copy_(tensor_from(reply.frames[0], h["dt"], h["n"]))
            if grad is None:
                set_raw_grad(p, flat.view(p.shape).to(p.device))
            elif not direct:
                grad.copy_(flat.view(p.shape))

    def _ask(self, p: torch.Tensor) -> list[Reply]:
        """Every chunk's answer (a VALUE) to a PULL of the mean gradient the servers
        applied in the round of the value ``p`` holds, waiting for that value first if
        it is still arriving. Blocks (one PULL per chunk); raises as :meth:`Pusher.ask`
        (BAD_STATE :class:`RemoteError` where a server no longer holds that mean)."""
        pusher = self._pusher
        if p in pusher.arriving:
            pusher.arrive([p])
        epoch, rounds = pusher.epoch, pusher.rounds
        return pusher.ask(
            [
                (c, headers.pull(chunk=c.id, epoch=epoch, mean_of=rounds.get(c.id, -1)), [])
                for c in pusher.chunks_of[p]
            ]
        )

    def _settle_before(self, p: torch.Tensor) -> Callable[[torch.Tensor], None]:
        """The hook run as backward computes ``p``'s gradient, before autograd adds it
        to ``.grad``: a mean owed is fetched first if ``.grad`` is kept (the sum is then
        Horovod's: the mean plus this gradient), forgotten if not."""

        def settle_first(_: torch.Tensor) -> None:
            if owed(p):
                if raw_grad(p) is None:
                    forget(p)
                else:
                    settle(p)

        return settle_first
