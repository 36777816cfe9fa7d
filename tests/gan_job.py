"""A GAN-like job of two models, each with a DistributedOptimizer of its own, stepped
alternately (the discriminator, then the generator), and its one-process reference.

Worker r of N trains on its slice of each global batch (real samples and noise, slices
of unequal sizes), with each optimizer's ``batch_size`` set to its slice's size; the
reference runs the same two optimizers in one process over the whole global batches.
Under BSP the parameters of both models must agree. While the generator steps, the
discriminator's parameters are frozen (as a Horovod GAN must: its optimizer would
otherwise see a second backward before its step).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

STEPS = 12
GLOBAL_BATCH = 24
NOISE = 4
FEATURES = 6


@dataclasses.dataclass(frozen=True)
class GanSetup:
    # The generator's and the discriminator's optimizers: "adam", "sgd" (momentum,
    # nesterov, weight decay), "rmsprop-sum" (a subclass: summation mode).
    gen: str
    disc: str
    batch_sizes: tuple[int, ...]
    steps: int = STEPS

    @property
    def workers(self) -> int:
        return len(self.batch_sizes)


def make_models(seed: int) -> tuple[nn.Module, nn.Module]:
    # A local generator, not the global one: tests run several workers as threads.
    g = torch.Generator().manual_seed(seed)
    gen = nn.Sequential(nn.Linear(NOISE, 16), nn.Tanh(), nn.Linear(16, FEATURES))
    disc = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
    with torch.no_grad():
        for p in [*gen.parameters(), *disc.parameters()]:
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return gen, disc


class SummedRMSprop(torch.optim.RMSprop):
    """A user subclass: trimtab runs it in summation mode (workers apply it)."""


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.5, 0.999))
    if name == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3
        )
    if name == "rmsprop-sum":
        return SummedRMSprop(model.parameters(), lr=0.01)
    raise ValueError(name)


def global_batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(real samples, noise) per step."""
    g = torch.Generator().manual_seed(11)
    return [
        (
            torch.randn(GLOBAL_BATCH, FEATURES, generator=g) * 0.5 + 1.0,
            torch.randn(GLOBAL_BATCH, NOISE, generator=g),
        )
        for _ in range(steps)
    ]


def _bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def disc_loss(gen: nn.Module, disc: nn.Module, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return _bce(disc(x), 1.0) + _bce(disc(gen(z).detach()), 0.0)


def gen_loss(gen: nn.Module, disc: nn.Module, z: torch.Tensor) -> torch.Tensor:
    return _bce(disc(gen(z)), 1.0)


def _frozen(model: nn.Module, frozen: bool) -> None:
    for p in model.parameters():
        p.requires_grad_(not frozen)


def train(
    setup: GanSetup,
    gen: nn.Module,
    disc: nn.Module,
    gen_opt: torch.optim.Optimizer,
    disc_opt: torch.optim.Optimizer,
    sizes: tuple[int, ...] | None,
    rank: int,
) -> list[torch.Tensor]:
    """Alternate the discriminator's and the generator's steps over the global batches
    (``sizes``: each worker's slice, this worker's is ``rank``'s; None: the whole
    batch). Returns both models' parameters."""
    for x, z in global_batches(setup.steps):
        if sizes is not None:
            start = sum(sizes[:rank])
            x, z = x[start : start + sizes[rank]], z[start : start + sizes[rank]]
        disc_opt.zero_grad()
        disc_loss(gen, disc, x, z).backward()
        disc_opt.step()
        _frozen(disc, True)
        gen_opt.zero_grad()
        gen_loss(gen, disc, z).backward()
        gen_opt.step()
        _frozen(disc, False)
    return [p.detach().clone() for p in [*gen.parameters(), *disc.parameters()]]


def reference(setup: GanSetup) -> list[torch.Tensor]:
    """One process over the global batches."""
    gen, disc = make_models(42)
    return train(
        setup,
        gen,
        disc,
        make_optimizer(setup.gen, gen),
        make_optimizer(setup.disc, disc),
        None,
        0,
    )


def train_worker(setup: GanSetup, rank: int, context: object = None) -> list[torch.Tensor]:
    """Train as worker ``rank`` (the job is the default one unless ``context``): two
    DistributedOptimizers, the generator's declared first."""
    import trimtab

    # Workers other than the root start from other values: the root's must win.
    gen, disc = make_models(42 if rank == 0 else 1000 + rank)
    gen_opt = trimtab.DistributedOptimizer(
        make_optimizer(setup.gen, gen),
        gen.named_parameters(),
        context=context,  # type: ignore[arg-type]
    )
    disc_opt = trimtab.DistributedOptimizer(
        make_optimizer(setup.disc, disc),
        disc.named_parameters(),
        context=context,  # type: ignore[arg-type]
    )
    gen_opt.batch_size = disc_opt.batch_size = setup.batch_sizes[rank]
    return train(setup, gen, disc, gen_opt, disc_opt, setup.batch_sizes, rank)


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))
