"""What the workers of ``trimtab experiment faults`` and ``soak`` processed, step by step,
and the one-process run over exactly those samples that the job must equal.

Each worker process appends to its own JSON-lines file (:class:`SampleLog`): a ``begin``
line before it computes a step (the step's clock and sample indices), a ``done`` line
once the step returned (with the time), each written through at once, so what a worker
killed with SIGKILL did is on disk up to its death. :func:`read_logs` reads every
worker's file, :func:`processed` says which samples each step's update was made of
(every ``done`` step, and the step a worker died in where its gradient was applied:
``after-reply``), and :func:`reference` replays them in one process.

The model, data and optimizer are this module's (:func:`make_model`, :func:`dataset`,
:func:`make_optimizer`), so the workers and the reference share them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

SAMPLES = 4096
FEATURES = 16
CLASSES = 4


def make_model(seed: int = 42, hidden: int = 64) -> nn.Module:
    """Three layers (six tensors, so six chunks spread over the servers)."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(FEATURES, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, CLASSES),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """The samples, the same in every process (seeded)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
    return x, y


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


class SampleLog:
    """One worker process's log, ``DIR/worker-PID.jsonl``. Not thread-safe; each write
    blocks for one small ``write``."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.path = directory / f"worker-{os.getpid()}.jsonl"
        self.rank = rank
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _write(self, record: Mapping[str, Any]) -> None:
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def begin(self, clock: int, indices: Sequence[int]) -> None:
        """Step ``clock`` is about to be computed on ``indices``."""
        self._write({"rank": self.rank, "clock": clock, "begin": list(indices)})

    def done(self, clock: int) -> None:
        """Step ``clock`` returned (its update is applied and its values are here)."""
        self._write({"rank": self.rank, "clock": clock, "done": time.time()})

    def close(self) -> None:
        os.close(self._fd)


def read_logs(directory: Path) -> list[dict[str, Any]]:
    """Every record of every worker's log in ``directory``, each with ``pid`` added
    (a torn last line, cut by a kill, is skipped)."""
    records = []
    for path in sorted(directory.glob("worker-*.jsonl")):
        pid = int(path.stem.split("-", 1)[1])
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            record["pid"] = pid
            records.append(record)
    return records


def processed(
    records: Iterable[Mapping[str, Any]], applied_undone: Iterable[tuple[int, int]] = ()
) -> dict[int, list[int]]:
    """Step -> the sample indices its update was made of: each worker's ``begin`` of a
    step it finished (``done``), plus those of the (pid, clock) pairs in
    ``applied_undone`` (a worker killed after its step's reply: applied, not done)."""
    begun: dict[tuple[int, int], list[int]] = {}
    finished: set[tuple[int, int]] = set(applied_undone)
    for r in records:
        key = (int(r["pid"]), int(r["clock"]))
        if "begin" in r:
            begun[key] = list(r["begin"])
        if "done" in r:
            finished.add(key)
    steps: dict[int, list[int]] = {}
    for (pid, clock), indices in sorted(begun.items()):
        if (pid, clock) in finished:
            steps.setdefault(clock, []).extend(indices)
    return steps


def done_times(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """When any worker finished any step, sorted."""
    return sorted(float(r["done"]) for r in records if "done" in r)


def reference(steps: Mapping[int, Sequence[int]], hidden: int) -> list[torch.Tensor]:
    """One process over ``steps`` in clock order: each update the mean gradient of that
    step's samples (as the workers' b / B weighting makes it)."""
    x, y = dataset()
    model = make_model(hidden=hidden)
    opt = make_optimizer(model)
    for clock in sorted(steps):
        idx = torch.tensor(sorted(steps[clock]), dtype=torch.long)
        opt.zero_grad()
        loss_of(model, x[idx], y[idx]).backward()  # type: ignore[no-untyped-call]
        opt.step()
    return [p.detach().clone() for p in model.parameters()]
