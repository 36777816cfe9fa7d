"""Server-side optimizers on chunks give torch's result on whole tensors."""

from __future__ import annotations

import pytest
import torch

from trimtab import ConfigError
from trimtab.roles.server.optim import ChunkOptimizer, OptimizerMode, choose_mode, hyperparameters

CASES = [
    (torch.optim.SGD, {"lr": 0.1}),  # plain: the server's fused step
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.5, "dampening": 0.1}),
    (torch.optim.Adam, {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.1}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.9}),
    (torch.optim.Adagrad, {"lr": 0.1}),
]


@pytest.mark.parametrize(("cls", "kwargs"), CASES)
def test_chunks_match_whole_tensor(cls: type[torch.optim.Optimizer], kwargs: dict) -> None:
    torch.manual_seed(0)
    whole = torch.nn.Parameter(torch.randn(100))
    ref = cls([whole], **kwargs)
    hp = hyperparameters(ref.param_groups[0])
    values = whole.detach().clone()
    chunks = [ChunkOptimizer(cls.__name__, values[i : i + 30], hp) for i in range(0, 100, 30)]
    for step in range(6):
        grad = torch.randn(100)
        if step == 3:  # a scheduler changes the learning rate mid-run
            ref.param_groups[0]["lr"] *= 0.5
            for c in chunks:
                c.set_hparams(hyperparameters(ref.param_groups[0]))
        whole.grad = grad.clone()
        ref.step()
        for i, c in zip(range(0, 100, 30), chunks, strict=True):
            c.step(grad[i : i + 30].clone())
    torch.testing.assert_close(values, whole.detach(), rtol=0, atol=1e-6)


def test_mode_choice() -> None:
    p = [torch.nn.Parameter(torch.zeros(2))]

    class MySGD(torch.optim.SGD):
        pass

    assert choose_mode(torch.optim.SGD(p, lr=1.0)) is OptimizerMode.SERVER
    assert choose_mode(MySGD(p, lr=1.0)) is OptimizerMode.SUMMATION  # may override step
    assert choose_mode(torch.optim.LBFGS(p)) is OptimizerMode.SUMMATION
    assert choose_mode(torch.optim.SGD(p, lr=1.0), "summation") is OptimizerMode.SUMMATION
    with pytest.raises(ConfigError, match="summation"):
        choose_mode(torch.optim.LBFGS(p), "server")
    with pytest.raises(ConfigError):
        choose_mode(torch.optim.SGD(p, lr=1.0), "fast")


@pytest.mark.parametrize("grad_enabled", [True, False])
@pytest.mark.parametrize(("cls", "kwargs"), CASES)
def test_server_step_is_torchs_step_bit_for_bit(
    cls: type[torch.optim.Optimizer], kwargs: dict, grad_enabled: bool
) -> None:
    # ChunkOptimizer calls the class's own step, without torch's wrappers: the values
    # and the state must be exactly what optimizer.step() gives.
    torch.manual_seed(1)
    start = torch.randn(64)
    ref_param = torch.nn.Parameter(start.clone())
    ref = cls([ref_param], foreach=False, **kwargs)
    chunk = ChunkOptimizer(cls.__name__, start.clone(), hyperparameters(ref.param_groups[0]))
    with torch.set_grad_enabled(grad_enabled):
        for _ in range(5):
            grad = torch.randn(64)
            ref_param.grad = grad.clone()
            ref.step()
            chunk.step(grad.clone())
    assert torch.equal(chunk.param.detach(), ref_param.detach())
    assert not chunk.param.requires_grad and chunk.param.grad is None
    ref_states, states = ref.state_dict()["state"], chunk.state_dict()["state"]
    assert states.keys() == ref_states.keys()  # (plain SGD keeps none)
    for i, state in states.items():
        assert state.keys() == ref_states[i].keys()
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(ref_states[i][key])), key


def test_plain_sgd_follows_a_changed_learning_rate_and_momentum() -> None:
    # Plain SGD's step is one add_ (no torch step): a scheduler's new lr, and momentum
    # turned on, must reach it exactly as torch's own step would take them.
    torch.manual_seed(2)
    start = torch.randn(32)
    ref_param = torch.nn.Parameter(start.clone())
    ref = torch.optim.SGD([ref_param], lr=0.1, foreach=False)
    chunk = ChunkOptimizer("SGD", start.clone(), hyperparameters(ref.param_groups[0]))
    for hp in ({}, {"lr": 0.37}, {"momentum": 0.9}, {"momentum": 0.0, "lr": 0.05}):
        ref.param_groups[0].update(hp)
        chunk.set_hparams(hp)
        for _ in range(3):
            grad = torch.randn(32)
            ref_param.grad = grad.clone()
            ref.step()
            chunk.step(grad.clone())
        assert torch.equal(chunk.param.detach(), ref_param.detach()), hp


def test_a_server_process_never_imports_torch_dynamo() -> None:
    """``trimtab server`` marks torch.optim's compile guards as done (it never compiles):
    building, stepping, reading and loading every server-side optimizer, and the warm-up,
    then import nothing of torch._dynamo (0.75 s of CPU in each server otherwise). A
    fresh interpreter: this one may have imported it already."""
    import subprocess
    import sys

    script = """
import sys
import torch
from trimtab.roles.server.optim import ELEMENTWISE, ChunkOptimizer, never_compiled, warm_up
assert never_compiled() >= 2  # add_param_group and state_dict at least
warm_up()
for name in ELEMENTWISE:
    chunk = ChunkOptimizer(name, torch.zeros(8), {"lr": 0.1})
    chunk.step(torch.ones(8))
    chunk.optimizer.load_state_dict(chunk.state_dict())
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stdout + done.stderr
