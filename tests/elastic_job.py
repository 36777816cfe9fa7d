"""The data and the one-process reference of the elastic-worker tests: the equivalence
job's model and optimizer over the samples the workers actually processed, step by step
(as :func:`trimtab.data.processed_samples` reads their records back)."""

from __future__ import annotations

import torch

from tests.equivalence_job import loss_of, make_model, make_optimizer

EPOCHS = 2
STEPS_PER_EPOCH = 10
GLOBAL_BATCH = 24


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    n = STEPS_PER_EPOCH * GLOBAL_BATCH
    return torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g)


def lr_at(step: int) -> float:
    """The learning-rate schedule, by step (a drop mid-run)."""
    return 0.05 * (0.3 if step >= 10 else 1.0)


def reference(samples: dict[int, list[int]], steps: int | None = None) -> list[torch.Tensor]:
    """One process over ``samples`` (step -> the indices processed), its first ``steps``
    steps (all by default). Raises ``AssertionError`` if a step is missing."""
    x, y = dataset()
    model = make_model()
    opt = make_optimizer("sgd", model)
    order = sorted(samples)
    assert order == list(range(len(order))), f"steps missing: {order}"
    for step in order[:steps]:
        idx = samples[step]
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad()
        loss_of(model, x[idx], y[idx]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]
