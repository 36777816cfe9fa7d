"""``.grad`` after ``step()`` fetched when read (trimtab.frontend.meangrad), without a job:
the class swap keeps a parameter a parameter, a read fetches what is owed once, and
clearing or replacing ``.grad`` forgets it. The fetch over real servers:
tests/integration/test_horovod_grads.py."""

from __future__ import annotations

import copy
import io
import logging
import pickle
from typing import Any

import pytest
import torch
from torch import nn

from trimtab.errors import RemoteError
from trimtab.frontend import meangrad
from trimtab.frontend.meangrad import MeanGradParameter, MeanGrads


def test_a_swapped_parameter_stays_a_parameter_and_copies_as_one() -> None:
    model = nn.Linear(3, 2)
    p = model.weight
    assert meangrad.adopt(p) and type(p) is MeanGradParameter
    assert isinstance(p, nn.Parameter) and model.weight is p
    assert next(iter(model.parameters())) is p
    assert type(pickle.loads(pickle.dumps(p))) is nn.Parameter
    assert torch.equal(copy.deepcopy(model).weight, p)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf)["weight"], p.detach())
    model(torch.ones(1, 3)).sum().backward()  # autograd fills .grad as ever
    assert p.grad is not None and p.grad.shape == (2, 3)
    meangrad.release(p)
    assert type(p) is nn.Parameter
    assert not meangrad.adopt(torch.zeros(2, requires_grad=True))  # not a Parameter: kept


def test_a_read_fetches_what_is_owed_once_and_clearing_forgets_it() -> None:
    p = nn.Parameter(torch.zeros(2))
    meangrad.adopt(p)
    p.grad = torch.ones(2)
    fetched: list[int] = []

    def fetch(q: torch.Tensor) -> None:
        fetched.append(1)
        meangrad.set_raw_grad(q, torch.full((2,), 7.0))

    meangrad.owe(p, fetch)
    assert meangrad.raw_grad(p).tolist() == [1.0, 1.0]  # type: ignore[union-attr]
    assert p.grad.tolist() == [7.0, 7.0]  # type: ignore[union-attr]
    assert p.grad.tolist() == [7.0, 7.0] and fetched == [1]  # type: ignore[union-attr]
    for clear in ("assign", "delete"):
        meangrad.owe(p, fetch)
        if clear == "assign":
            p.grad = torch.zeros(2)
        else:
            del p.grad
        assert not meangrad.owed(p)
    assert fetched == [1]
    meangrad.release(p)


class _Pusher:
    """What MeanGrads uses of a Pusher, answering every request with ``error``."""

    def __init__(self, params: list[torch.Tensor], error: RemoteError) -> None:
        self.chunks_of: dict[torch.Tensor, list[Any]] = {p: [] for p in params}
        self.arriving: dict[torch.Tensor, Any] = {}
        self.rounds: dict[int, int] = {}
        self.epoch = 1
        self.error = error

    def ask(self, requests: list[Any]) -> list[Any]:
        raise self.error


def test_a_mean_no_longer_held_leaves_the_workers_own_gradient_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = nn.Parameter(torch.zeros(3))
    pusher = _Pusher([p], RemoteError("bad_state", "the mean of round 4 is not held here"))
    means = MeanGrads(pusher)  # type: ignore[arg-type]
    p.grad = torch.ones(3)
    means.stepped()
    with caplog.at_level(logging.WARNING, logger="trimtab"):
        assert p.grad.tolist() == [1.0, 1.0, 1.0]  # type: ignore[union-attr]
    assert "keeps this worker's own gradient" in caplog.text
    assert "not held here" in caplog.text
    pusher.error = RemoteError("internal", "boom")  # any other refusal is raised
    means.stepped()
    with pytest.raises(RemoteError, match="boom"):
        _ = p.grad
    means.close()
    assert type(p) is nn.Parameter and not meangrad.owed(p)
