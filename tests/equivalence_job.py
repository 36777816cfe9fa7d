"""The training job of the equivalence tests, and its one-process reference.

Worker r of N trains on its slice of each global batch (slices of unequal sizes), with
``optimizer.batch_size`` set to its slice's size; the reference runs the same optimizer
in one process over the whole global batches. Under BSP the parameters must agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

STEPS = 20
GLOBAL_BATCH = 24


@dataclasses.dataclass(frozen=True)
class Setup:
    # "sgd" (momentum, nesterov, weight decay), "sgd-sum" (the same, run in summation
    # mode: servers average, workers apply it), "adam", "rmsprop-sum"
    optimizer: str
    batch_sizes: tuple[int, ...]
    steps: int = STEPS
    lr_drop_at: int = 10  # a scheduler-like change of the learning rate mid-run
    overlap: bool = False  # DistributedOptimizer(model=...): forward waits per module
    hidden: int = 32  # the hidden layer's width (192: weights too big to ride in a header)

    @property
    def workers(self) -> int:
        return len(self.batch_sizes)


def make_model(seed: int = 42, hidden: int = 32) -> nn.Module:
    # A local generator, not the global one: tests run several workers as threads.
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(10, hidden), nn.Tanh(), nn.Linear(hidden, 16), nn.Tanh(), nn.Linear(16, 3)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name in ("sgd", "sgd-sum"):
        return torch.optim.SGD(
            model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3
        )
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-3)
    if name == "rmsprop-sum":
        return SummedRMSprop(model.parameters(), lr=0.01)
    raise ValueError(name)


class SummedRMSprop(torch.optim.RMSprop):
    """A user subclass: trimtab cannot know its step is element-wise, so it runs in
    summation mode (servers average gradients, workers apply it)."""


def global_batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (
            torch.randn(GLOBAL_BATCH, 10, generator=g),
            torch.randint(0, 3, (GLOBAL_BATCH,), generator=g),
        )
        for _ in range(steps)
    ]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def reference(setup: Setup, wire: torch.dtype | None = None) -> list[torch.Tensor]:
    """One process over the global batches. With ``wire`` (gradient compression), the
    gradient of each worker's slice is rounded to ``wire`` before the weighted mean, as
    the workers' pushes are."""
    model = make_model(hidden=setup.hidden)
    opt = make_optimizer(setup.optimizer, model)
    for step, (x, y) in enumerate(global_batches(setup.steps)):
        if step == setup.lr_drop_at:
            for group in opt.param_groups:
                group["lr"] *= 0.3
        opt.zero_grad()
        if wire is None:
            loss_of(model, x, y).backward()
        else:
            total = [torch.zeros_like(p) for p in model.parameters()]
            start = 0
            for size in setup.batch_sizes:
                model.zero_grad()
                loss_of(model, x[start : start + size], y[start : start + size]).backward()
                for t, p in zip(total, model.parameters(), strict=True):
                    assert p.grad is not None
                    t.add_(p.grad.to(wire).float(), alpha=size / GLOBAL_BATCH)
                start += size
            for t, p in zip(total, model.parameters(), strict=True):
                p.grad = t
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_worker(
    setup: Setup,
    rank: int,
    context: object = None,
    sizes_out: list | None = None,
    on_step: Callable[[int], None] | None = None,
) -> list[torch.Tensor]:
    """Train as worker ``rank`` (the job is the default one unless ``context``).

    Each step's slice follows ``opt.batch_sizes`` when the job sets them (LB-BSP),
    else ``setup.batch_sizes``; the sizes used are appended to ``sizes_out``. A job
    resumed from a checkpoint starts at the optimizer's clock: the steps before it are
    skipped (the learning-rate change among them still made, as a scheduler's state
    would be restored)."""
    import trimtab

    # Workers other than the root start from other values: the root's must win.
    model = make_model(42 if rank == 0 else 1000 + rank, setup.hidden)
    inner = make_optimizer(setup.optimizer, model)
    opt = trimtab.DistributedOptimizer(
        inner,
        model.named_parameters(),
        context=context,  # type: ignore[arg-type]
        model=model if setup.overlap else None,
        mode="summation" if setup.optimizer == "sgd-sum" else "auto",
    )
    first = opt.clock  # 0, or a resumed job's checkpoint's clock
    for step, (x, y) in enumerate(global_batches(setup.steps)):
        if step == setup.lr_drop_at:
            for group in inner.param_groups:
                group["lr"] *= 0.3
        if step < first:
            continue
        sizes = opt.batch_sizes or list(setup.batch_sizes)
        if sizes_out is not None:
            sizes_out.append(tuple(sizes))
        start = sum(sizes[:rank])
        end = start + sizes[rank]
        opt.batch_size = sizes[rank]
        opt.zero_grad()
        loss_of(model, x[start:end], y[start:end]).backward()
        opt.step()
        if on_step is not None:
            on_step(step)
    if setup.overlap:  # the last step's values are still arriving: state_dict waits
        return [v.clone() for v in model.state_dict().values()]
    return [p.detach().clone() for p in model.parameters()]


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def settled_stats(deadline_s: float = 60.0) -> dict:
    """The servers' counters and the job's status once its chunks are at rest: after
    the last step, a migration planned at the last step boundaries may still be moving
    chunks, and a chunk on its way is in neither server's counters. Polls until every
    chunk is held by one live server and none is moving (a chunk lost for good still
    fails the test: its counters are returned as they are after ``deadline_s``)."""
    import time

    import trimtab

    deadline = time.monotonic() + deadline_s
    while True:
        stats = {"servers": trimtab.server_stats(), "job": trimtab.job_status()}
        held = sorted(int(c) for s in stats["servers"] for c in s["versions"])
        settled = held == list(range(len(stats["job"]["owners"])))
        if (settled and not stats["job"]["migrating"]) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)
