"""The first step of a server-mode job, which finds out whether the script changes
gradients between ``synchronize()`` and ``step()``, and the check of every later step.

Why a probe: in server mode, pushes leave during backward, before anyone knows whether
the script will call ``synchronize()`` itself to clip or unscale gradients (Horovod's
recipes); by the time it changes them, the servers would have applied the update with
the unchanged ones. So a job's first step runs as summation mode does: the servers
answer the mean gradient and apply nothing (pushes carry ``g``). At its end
(:func:`end_probe`):

- If the script called ``synchronize()`` itself (rank 0's word decides; every worker
  must agree), the job stays in summation mode for good: servers sum, each worker
  applies its optimizer to the (changed) mean gradient, exactly as Horovod's does.
  Nothing moves: the servers' optimizer state, if any (a loaded checkpoint), is taken
  into the workers' optimizers.
- Otherwise every worker applies this step's update itself (the same mean gradient,
  state and code everywhere: the same result), rank 0 gives the servers the new values
  and optimizer state, and from the next step on the servers apply the updates: the
  fast path, unchanged. Every worker returns from that first ``step()`` only once the
  servers acknowledged rank 0's values and state (a barrier), so that no update of the
  next step and no ``state_dict()`` read comes before them.

Later, in server mode, a script that calls ``synchronize()`` and then changes a
gradient (seen by the gradient's identity and version counter) or skips ``step()``
gets a :class:`UsageError` (:func:`check_marks`), never a silently wrong update.
"""

from __future__ import annotations

import logging

import torch

from trimtab.errors import UsageError
from trimtab.frontend.pusher import Pusher
from trimtab.frontend.state import gather, scatter
from trimtab.roles.worker.context import Context

log = logging.getLogger("trimtab")

#: A gradient as synchronize() left it: its parameter, the gradient and its version.
Mark = tuple[torch.Tensor, torch.Tensor | None, int]

_noticed: list[bool] = []


def end_probe(
    ctx: Context, pusher: Pusher, inner: torch.optim.Optimizer, explicit: bool, apply: bool
) -> bool:
    """End the probing first step: ``explicit``, whether the script called
    ``synchronize()`` itself; ``apply``, whether it called ``step()`` (GradScaler may
    skip it). Returns whether the job now runs in summation mode. Collective (a
    barrier and a broadcast from rank 0); blocks. Raises :class:`UsageError` if this
    worker and rank 0 disagree about ``explicit``."""
    # The servers may hold state (a checkpoint loaded): this step starts from it. Every
    # worker reads it before rank 0 replaces it (the barrier).
    for p, st in gather(pusher, pusher.chunks_of).items():
        inner.state[p] = st
    ctx.barrier()
    flag = torch.tensor([1.0 if explicit else 0.0])
    ctx.broadcast({"trimtab.probe": flag}, 0)
    if bool(flag.item()) != explicit:
        raise UsageError(
            f"worker 0 {'called' if flag.item() else 'did not call'} synchronize() before "
            f"step() in the first step, worker {ctx.rank} {'did' if explicit else 'did not'}"
            ": do the same on every worker"
        )
    pusher.mean_only = False
    if apply:
        with torch.no_grad():
            inner.step()
    if explicit:
        pusher.mean_only = True  # the servers keep summing: every push says so
        if not _noticed:
            _noticed.append(True)
            log.warning(
                "trimtab: the script calls optimizer.synchronize() before step(): running "
                "in summation mode (servers sum gradients, each worker applies %s), so "
                "that gradients changed in between count",
                type(inner).__name__,
            )
        return True
    if ctx.rank == 0:
        scatter(pusher, inner.state, values=True)
    # No worker returns from step() before the servers hold that state: a state_dict()
    # read on another rank right after would miss it.
    ctx.barrier()
    inner.state.clear()
    pusher.summation = False
    return False


def marks_of(params: list[torch.Tensor]) -> list[Mark]:
    """Each parameter's gradient and its version, as synchronize() leaves them."""
    return [(p, p.grad, _version(p.grad)) for p in params]


def check_marks(marks: list[Mark] | None, apply: bool) -> None:
    """Server mode, after the script's own synchronize(): the servers applied this
    step's update then. Raises :class:`UsageError` if a gradient changed since (or
    ``apply`` is False: the script skipped step()). Never blocks."""
    if marks is None:
        return
    changed = any(p.grad is not g or _version(g) != v for p, g, v in marks)
    if changed or not apply:
        what = "changed gradients" if changed else "skipped step() (GradScaler)"
        raise UsageError(
            f"the script {what} after optimizer.synchronize(), but this optimizer runs in "
            "server mode: the servers applied the update with the gradients as "
            "synchronize() found them. Pass mode='summation' to DistributedOptimizer (or "
            "call synchronize() from the first step on, which makes mode='auto' choose it)"
        )


def _version(t: torch.Tensor | None) -> int:
    return -1 if t is None else int(t._version)
