"""A Horovod-style script for test_horovod_grads.py (issue 33): what a script finds in
``.grad`` and in the optimizer's state where Horovod documents it, ``import trimtab as
hvd`` and nothing else changed. Each case builds its own model and optimizer (a table
of its own) in one job, and each worker writes what it found to ``OUT/rank{r}.json``.

Usage: horovod_grads_worker.py OUT_DIR (under ``trimtab run --workers 2 --servers 2``).

The cases:

- ``no_grad``: Horovod's ``test_broadcast_state_no_grad``: after
  ``broadcast_optimizer_state`` of a fresh optimizer, a trained parameter's ``.grad``
  is a zero tensor, which ``hvd.broadcast`` takes; one with ``requires_grad=False``
  keeps None.
- ``mean_*``: after each ``step()``, ``.grad`` holds what Horovod's allreduce of the
  gradients found after backward gives (the mean; with ``op=Sum`` the sum), in server
  mode, with and without ``zero_grad()`` between steps (the next backward then adds to
  the mean, as under Horovod), with ``model=`` (values awaited by the next forward),
  with ``backward_passes_per_step=2`` (BytePS's accumulation) and with a parameter
  that only rank 0 uses.
- ``load_fresh``: ``load_state_dict`` of a fresh optimizer's ``state_dict()`` and of SGD
  without momentum's: accepted, and the state is a fresh optimizer's.
- ``state_after_first_step``: right after the first ``step()``, ``state_dict()`` holds
  every parameter's state on every rank, even when rank 0's hand-over of the first
  step's state to the servers is slow (forced here: it sleeps first).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import trimtab as hvd
from trimtab.frontend import probe

FEATURES, STEPS = 6, 4


class ModelNoGrad(nn.Module):
    """Horovod's test model: an integer index that is not trained, and a trained table."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.a = nn.Parameter(a.int(), requires_grad=False)
        self.b = nn.Parameter(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.b, 0, self.a.long()) * x


class Net(nn.Module):
    """Two layers and an extra head that only rank 0 uses (``spare``)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.first = nn.Linear(FEATURES, 5)
        self.second = nn.Linear(5, 2)
        self.spare = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor, spare: bool = False) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        out = self.second(h)
        return out + self.spare(h) if spare else out


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(3, FEATURES, generator=torch.Generator().manual_seed(100 * step + rank))


def no_grad_case() -> dict[str, Any]:
    model = ModelNoGrad(torch.tensor([1.0, 3.0]), torch.rand(4))
    opt = torch.optim.SGD(
        model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True
    )
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    grad = opt.param_groups[0]["params"][1].grad
    bgrad = hvd.broadcast(grad, root_rank=0)
    return {
        "untrained_grad_is_none": opt.param_groups[0]["params"][0].grad is None,
        "grad": None if grad is None else grad.tolist(),
        "broadcast_equal": bool(torch.equal(grad, bgrad)),
    }


def mean_case(
    *, zero: bool, overlap: bool = False, passes: int = 1, op: Any = None, name: str
) -> dict[str, Any]:
    """Train STEPS steps; after each step compare ``.grad`` with Horovod's result: the
    allreduce (op ``op``, default Average) of what ``.grad`` held before ``step()``."""
    rank = hvd.rank()
    model = Net(seed=1 + rank)
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
        op=op,
        model=model if overlap else None,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    worst, checked, none_after = 0.0, 0, []
    for step in range(STEPS):
        if zero or step == 0:
            opt.zero_grad()
        for k in range(passes):
            model(batch(step * passes + k, rank), spare=rank == 0).sum().backward()
        before = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        want = {
            n: hvd.allreduce(before.get(n, torch.zeros_like(p)), name=f"{name}.{step}.{n}", op=op)
            for n, p in model.named_parameters()
        }
        opt.step()
        for n, p in model.named_parameters():
            if p.grad is None:
                none_after.append(f"{step}:{n}")
                continue
            worst = max(worst, (p.grad - want[n]).abs().max().item())
            checked += 1
    return {"worst": worst, "checked": checked, "none_after": none_after, "mode": opt.mode.value}


def load_fresh_case() -> dict[str, Any]:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(FEATURES, 4), nn.Linear(4, 2))
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(2):
        opt.zero_grad()
        model(batch(step, hvd.rank())).sum().backward()
        opt.step()
    got: dict[str, Any] = {"trained_state": len(opt.state_dict()["state"])}
    # The state is the servers': each rank's load below replaces it for all, so every
    # read comes after every rank's load and before the next (the barriers).
    hvd.barrier()
    errors = {}
    other = nn.Sequential(nn.Linear(FEATURES, 4), nn.Linear(4, 2))  # the same layout
    for label, fresh in (
        ("adam", torch.optim.Adam(other.parameters(), lr=0.02)),
        ("sgd", torch.optim.SGD(other.parameters(), lr=0.02)),
    ):
        if label == "sgd":  # SGD without momentum keeps no state, even after a step
            other(batch(9, 0)).sum().backward()
            fresh.step()
        try:
            opt.load_state_dict(fresh.state_dict())
        except Exception as exc:  # what the test reports
            errors[label] = f"{type(exc).__name__}: {exc}"
        hvd.barrier()
        if label in errors:
            continue
        state = opt.state_dict()
        hvd.barrier()
        got[label] = {
            "state_keys": sorted(state["state"]),
            "lr": state["param_groups"][0]["lr"],
            "momentum_buffers_none": all(
                s.get("momentum_buffer", None) is None for s in state["state"].values()
            ),
        }
    got["errors"] = errors
    # Training goes on from a fresh state: Adam's step count starts again.
    opt.load_state_dict(torch.optim.Adam(model.parameters(), lr=0.01).state_dict())
    opt.zero_grad()
    model(batch(7, hvd.rank())).sum().backward()
    opt.step()
    got["steps_after_fresh"] = sorted(
        {float(s["step"]) for s in opt.state_dict()["state"].values()}
    )
    return got


def state_after_first_step_case(rounds: int) -> dict[str, Any]:
    real = probe.scatter

    def slow_scatter(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.1)  # rank 0's hand-over of the first step comes late
        real(*args, **kwargs)

    probe.scatter = slow_scatter  # type: ignore[assignment]
    missing = []
    try:
        for attempt in range(rounds):
            torch.manual_seed(attempt)
            model = nn.Sequential(nn.Linear(FEATURES, 4), nn.Tanh(), nn.Linear(4, 2))
            opt = hvd.DistributedOptimizer(
                torch.optim.Adam(model.parameters(), lr=0.01),
                named_parameters=[(f"r{attempt}.{n}", p) for n, p in model.named_parameters()],
            )
            opt.zero_grad()
            model(batch(attempt, hvd.rank())).sum().backward()
            opt.step()
            state = opt.state_dict()["state"]
            if len(state) != 4:
                missing.append([attempt, sorted(state)])
    finally:
        probe.scatter = real  # type: ignore[assignment]
    return {"rounds": rounds, "missing": missing}


def run(case: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """What ``case`` found, or the error it raised (the other cases still run)."""
    try:
        return case(*args, **kwargs)  # type: ignore[no-any-return]
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    out = Path(sys.argv[1])
    hvd.init()
    got: dict[str, Any] = {"rank": hvd.rank()}
    got["no_grad"] = run(no_grad_case)
    got["mean_zeroed"] = run(mean_case, zero=True, name="zeroed")
    got["mean_accumulated"] = run(mean_case, zero=False, name="accumulated")
    got["mean_overlap"] = run(mean_case, zero=True, overlap=True, name="overlap")
    got["mean_passes"] = run(mean_case, zero=True, passes=2, name="passes")
    got["mean_sum"] = run(mean_case, zero=True, op=hvd.Sum, name="sum")
    got["load_fresh"] = run(load_fresh_case)
    got["state_after_first_step"] = run(state_after_first_step_case, int(sys.argv[2]))
    (out / f"rank{hvd.rank()}.json").write_text(json.dumps(got))
    hvd.shutdown()


if __name__ == "__main__":
    main()
