"""Training scripts written the way Horovod users write them, one per pattern.

Each pattern is a function of ``hvd``, the module a script imports as ``hvd``: trimtab
under ``trimtab run`` (tests/integration/horovod_script.py), or :class:`OneProcess`, a
one-process stand-in with Horovod's semantics for ``size() == 1``, which gives the
reference: the same script over the same global batches in a single process, where
every collective is the identity and the optimizer is the user's own.

The patterns are those of Horovod's PyTorch examples and tests (read, not copied):
metrics averaged with ``hvd.allreduce``, ``op=hvd.Average``, gradient accumulation with
``backward_passes_per_step``, a learning-rate warm-up, a checkpoint saved by rank 0 and
resumed through ``broadcast_optimizer_state``, the mixed-precision recipe
(``GradScaler`` with ``synchronize`` / ``skip_synchronize``), gradient clipping between
``synchronize()`` and ``step()``, and two optimizers stepped in turn (a GAN).

The global batch is fixed (``GLOBAL``) and split evenly, so the mean of the workers'
mean gradients is the mean gradient of the global batch; learning rates are therefore
not scaled by ``size()`` as Horovod's examples do (there the global batch grows with the
job).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS = 12
GLOBAL = 24
FEATURES = 10


def batches(steps: int = STEPS, seed: int = 7) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches, the same in every process."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(GLOBAL, FEATURES, generator=g), torch.randint(0, 3, (GLOBAL,), generator=g))
        for _ in range(steps)
    ]


def make_model(seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(FEATURES, 24), nn.Tanh(), nn.Linear(24, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def my_slice(hvd: Any, x: torch.Tensor) -> torch.Tensor:
    """This worker's share of a global batch (contiguous, equal sizes)."""
    share = len(x) // hvd.size()
    return x[hvd.rank() * share : (hvd.rank() + 1) * share]


def start(hvd: Any, seed: int = 42) -> nn.Module:
    """``hvd.init()`` and a model whose initial values differ per rank (the root's must
    win through ``broadcast_parameters``)."""
    hvd.init()
    return make_model(seed if hvd.rank() == 0 else seed + 1000 + hvd.rank())


def values(*models: nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"{m}.{name}": v.detach().clone()
        for m, model in enumerate(models)
        for name, v in model.state_dict().items()
    }


# -- the patterns ------------------------------------------------------------------------


def metric_average(hvd: Any, out: Path) -> dict[str, torch.Tensor]:
    """pytorch_mnist-style: the test loss and accuracy averaged over workers with
    ``hvd.allreduce`` (``metric_average``), SGD with momentum."""
    model = start(hvd)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    losses = []
    for x, y in batches():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(my_slice(hvd, x)), my_slice(hvd, y))
        loss.backward()
        optimizer.step()
        avg = hvd.allreduce(loss.detach(), name="train_loss")
        losses.append(float(avg))
    x, y = batches(1, seed=99)[0]
    with torch.no_grad():
        pred = model(my_slice(hvd, x)).argmax(1)
        acc = hvd.allreduce(
            (pred == my_slice(hvd, y)).float().mean(), name="avg_accuracy", op=hvd.Average
        )
    result = values(model)
    result["losses"] = torch.tensor(losses)
    result["accuracy"] = acc.reshape(1)
    return result


def op_average_adam(hvd: Any, out: Path) -> dict[str, torch.Tensor]:
    """``op=hvd.Average`` given explicitly, Adam with weight decay."""
    model = start(hvd)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-3),
        named_parameters=model.named_parameters(),
        op=hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in batches():
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(my_slice(hvd, x)), my_slice(hvd, y)).backward()
        optimizer.step()
    return values(model)


def accumulation(hvd: Any, out: Path) -> dict[str, torch.Tensor]:
    """Gradient accumulation: two backward passes per step, each over half of this
    worker's share, the loss divided by the passes (``backward_passes_per_step=2``)."""
    passes = 2
    model = start(hvd)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in batches():
        optimizer.zero_grad()
        xs, ys = my_slice(hvd, x).chunk(passes), my_slice(hvd, y).chunk(passes)
        for xi, yi in zip(xs, ys, strict=True):
            (nn.functional.cross_entropy(model(xi), yi) / passes).backward()
        optimizer.step()
    return values(model)


def warmup(hvd: Any, out: Path) -> dict[str, torch.Tensor]:
    """pytorch_imagenet-style learning-rate warm-up and decay, set on the optimizer's
    param groups before each step (``adjust_learning_rate``), RMSprop."""
    model = start(hvd)
    base = 0.01
    optimizer = hvd.DistributedOptimizer(
        torch.optim.RMSprop(model.parameters(), lr=base, momentum=0.2),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for step, (x, y) in enumerate(batches()):
        lr = base * (step + 1) / 5 if step < 5 else base * 0.5 ** ((step - 5) // 3)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(my_slice(hvd, x)), my_slice(hvd, y)).backward()
        optimizer.step()
    return values(model)


CHECKPOINT_AT = 5


def checkpoint(hvd: Any, out: Path, phase: str = "whole") -> dict[str, torch.Tensor]:
    """Rank 0 saves the model and the optimizer after ``CHECKPOINT_AT`` steps (phase
    ``first``); a new job (phase ``resume``) builds everything afresh, rank 0 loads the
    checkpoint, and ``broadcast_parameters`` + ``broadcast_optimizer_state`` give it to
    every worker before training goes on. Phase ``whole`` trains without stopping.
    SGD with Nesterov momentum and weight decay in group 0, group 1 with its
    own learning rate: two param groups, as real checkpoints have."""
    model = start(hvd, seed=42 if phase != "resume" else 5)
    first, _, second = model.children()
    optimizer = torch.optim.SGD(
        [
            {"params": first.parameters()},
            {"params": second.parameters(), "lr": 0.02, "nesterov": False, "momentum": 0.5},
        ],
        lr=0.05,
        momentum=0.9,
        nesterov=True,
        weight_decay=1e-3,
    )
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    path = out / "checkpoint.pt"
    begin = 0
    if phase == "resume":
        begin = CHECKPOINT_AT
        if hvd.rank() == 0:
            saved = torch.load(path)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    end = CHECKPOINT_AT if phase == "first" else STEPS
    for x, y in batches()[begin:end]:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(my_slice(hvd, x)), my_slice(hvd, y)).backward()
        optimizer.step()
    if phase == "first" and hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    return values(model)


def mixed_precision(hvd: Any, out: Path) -> dict[str, torch.Tensor]:
    """Horovod's mixed-precision recipe: the loss scaled by a ``GradScaler``, gradients
    synchronized, unscaled in place, then ``scaler.step`` under ``skip_synchronize()``."""
    model = start(hvd)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for x, y in batches():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(my_slice(hvd, x)), my_slice(hvd, y))
        scaler.scale(loss).backward()
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()
    return values(model)


def clipping(hvd: Any, out: Path) -> dict[str, torch.Tensor]:
    """Gradient clipping on the averaged gradients: ``synchronize()``, clip, then
    ``step()`` under ``skip_synchronize()`` (Horovod's documented recipe). The norm bound
    is small enough that every step clips."""
    model = start(hvd)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.02),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in batches():
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(my_slice(hvd, x)), my_slice(hvd, y)).backward()
        optimizer.synchronize()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
        with optimizer.skip_synchronize():
            optimizer.step()
    return values(model)


def two_optimizers(hvd: Any, out: Path) -> dict[str, torch.Tensor]:
    """A GAN's shape: a generator and a discriminator, each with its own optimizer of
    its own class, stepped in turn every iteration."""
    hvd.init()
    offset = 0 if hvd.rank() == 0 else 1000 + hvd.rank()
    g = torch.Generator().manual_seed(3 + offset)
    gen = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, FEATURES))
    disc = nn.Sequential(nn.Linear(FEATURES, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    with torch.no_grad():
        for p in [*gen.parameters(), *disc.parameters()]:
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    opt_g = hvd.DistributedOptimizer(
        torch.optim.Adam(gen.parameters(), lr=0.01, betas=(0.5, 0.999)),
        named_parameters=gen.named_parameters(prefix="gen"),
    )
    opt_d = hvd.DistributedOptimizer(
        torch.optim.SGD(disc.parameters(), lr=0.05, momentum=0.5),
        named_parameters=disc.named_parameters(prefix="disc"),
    )
    hvd.broadcast_parameters(gen.state_dict(), root_rank=0)
    hvd.broadcast_parameters(disc.state_dict(), root_rank=0)
    noise = torch.Generator().manual_seed(11)
    bce = nn.functional.binary_cross_entropy_with_logits
    for real, _ in batches():
        z = torch.randn(GLOBAL, 4, generator=noise)
        real, z = my_slice(hvd, real), my_slice(hvd, z)
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        opt_d.zero_grad()
        fake = gen(z).detach()
        (bce(disc(real), ones) + bce(disc(fake), zeros)).backward()
        opt_d.step()
        # The generator's step must not touch the discriminator's gradients (with
        # Horovod, they would be reduced a second time before its next step).
        disc.requires_grad_(False)
        opt_g.zero_grad()
        bce(disc(gen(z)), ones).backward()
        opt_g.step()
        disc.requires_grad_(True)
    return values(gen, disc)


def byteps_optimizer(bps: Any, out: Path) -> dict[str, torch.Tensor]:
    """A BytePS user's script (``import byteps.torch as bps`` swapped for
    ``import trimtab.byteps.torch as bps``): BytePS's optimizer keywords
    (``compression``, ``staleness=0``), its broadcasts, and the loss averaged in place with
    ``push_pull_inplace`` under a declared name; Adagrad."""
    bps.init()
    model = make_model(42 if bps.rank() == 0 else 1000 + bps.rank())
    optimizer = bps.DistributedOptimizer(
        torch.optim.Adagrad(model.parameters(), lr=0.05),
        named_parameters=model.named_parameters(),
        compression=bps.Compression.none,
        backward_passes_per_step=1,
        staleness=0,
    )
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    bps.declare("loss")
    losses = []
    for x, y in batches():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(my_slice(bps, x)), my_slice(bps, y))
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        bps.push_pull_inplace(mean, average=True, name="loss")
        losses.append(float(mean))
    result = values(model)
    result["losses"] = torch.tensor(losses)
    return result


PATTERNS: dict[str, Callable[..., dict[str, torch.Tensor]]] = {
    "metric_average": metric_average,
    "op_average_adam": op_average_adam,
    "accumulation": accumulation,
    "warmup": warmup,
    "checkpoint": checkpoint,
    "mixed_precision": mixed_precision,
    "clipping": clipping,
    "two_optimizers": two_optimizers,
    "byteps_optimizer": byteps_optimizer,
}


# -- the one-process reference -----------------------------------------------------------


class _Op:
    def __init__(self, name: str) -> None:
        self.name = name


class OneProcess:
    """Horovod's API for a job of one process: collectives are the identity, the
    optimizer is the user's own. Running a pattern with it is the reference run."""

    Average = _Op("Average")
    Sum = _Op("Sum")

    def init(self) -> None:
        pass

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def broadcast_parameters(self, params: Any, root_rank: int) -> None:
        pass

    def broadcast_optimizer_state(self, optimizer: Any, root_rank: int) -> None:
        pass

    def allreduce(self, tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return tensor.clone()

    def push_pull_inplace(self, tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return tensor

    def declare(self, name: str) -> None:
        pass

    class Compression:
        none = None

    def DistributedOptimizer(
        self, optimizer: torch.optim.Optimizer, **kwargs: Any
    ) -> torch.optim.Optimizer:
        assert kwargs.get("staleness", 0) == 0
        return _Plain(optimizer)


class _Plain:
    """The user's optimizer with Horovod's extra methods, which do nothing alone."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def synchronize(self) -> None:
        pass

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        yield


def reference(pattern: str, out: Path) -> dict[str, torch.Tensor]:
    """The pattern run in one process over the same global batches."""
    run = PATTERNS[pattern]
    return run(OneProcess(), out)
