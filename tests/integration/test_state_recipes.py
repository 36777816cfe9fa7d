"""Issue 18 over real processes and TCP: a checkpoint saved by rank 0 the Horovod way and
resumed in a new job; Horovod's clipping and mixed-precision recipes; op=Sum and
gradient_predivide_factor. Each compared with one process running plain torch over the
same global batches, to 1e-5."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import global_batches, loss_of, make_model, max_difference
from tests.integration.test_equivalence import _run
from tests.state_job import OPTIMIZERS, reference
from trimtab.frontend.params import RESYNC_WARNING
from trimtab.launch.job import LaunchConfig

SCRIPT = Path(__file__).with_name("state_worker.py")


def _job(out: Path, *args: object) -> list[str]:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=512)
    command = [sys.executable, str(SCRIPT), *map(str, args[:4]), str(out), *map(str, args[4:])]
    lines = _run(config, command, deadline_s=60.0)
    assert processes_of(config.job) == []
    return lines


def _params(out: Path) -> list[list[torch.Tensor]]:
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.timeout(150)
# (SGD with momentum's checkpoint: tests/integration/test_horovod_patterns.py)
@pytest.mark.parametrize("name", ["adam", "rmsprop"])
def test_checkpoint_resumed_in_a_new_job_equals_an_unstopped_run(tmp_path: Path, name: str) -> None:
    """Job 1: 4 steps, rank 0 saves {"model", "optimizer"}. Job 2 (new coordinator and
    servers): rank 0 loads both, broadcast_parameters + broadcast_optimizer_state (the
    other rank's optimizer is fresh), 4 more steps. Both ranks end where one process
    running 8 steps does."""
    _job(tmp_path, name, "plain", 0, 4)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["optimizer"]["state"], "the checkpoint holds no optimizer state"
    _job(tmp_path, name, "plain", 4, 8)
    expected = reference(name, 8)
    for got in _params(tmp_path):
        assert max_difference(got, expected) < 1e-5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("recipe", ["clip", "amp"])
def test_horovod_recipes_changing_gradients_after_synchronize(tmp_path: Path, recipe: str) -> None:
    """synchronize(); clip_grad_norm_ (or GradScaler.unscale_ of a 2**16-scaled loss);
    with skip_synchronize(): step(). The same as one process doing it with plain torch;
    the job says it switched to summation mode."""
    lines = _job(tmp_path, "adam", recipe, 0, 6)
    expected = reference("adam", 6, recipe)
    for got in _params(tmp_path):
        assert max_difference(got, expected) < 1e-5
    assert sum("mode summation" in line for line in lines) == 2
    assert any("running in summation mode" in line for line in lines)


def _summed_reference(steps: int) -> list[torch.Tensor]:
    """One process whose loss is twice the mean: the gradient of the sum of the two
    workers' mean losses (equal batches)."""
    model = make_model()
    opt = OPTIMIZERS["sgd"](model.parameters())
    for x, y in global_batches(steps):
        opt.zero_grad()
        (2 * loss_of(model, x, y)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("op", "predivide"), [("Sum", "1"), ("Average", "4")])
def test_sum_and_predivide_and_horovods_warning(tmp_path: Path, op: str, predivide: str) -> None:
    """op=Sum: the servers' update uses the sum of the two workers' gradients; with
    gradient_predivide_factor=4 the mean again. The last step calls synchronize() and
    then step() without skip_synchronize(): Horovod's warning, and no second push (the
    parameters are still right)."""
    lines = _job(tmp_path, "sgd", "resync", 0, 5, op, predivide)
    expected = _summed_reference(5) if op == "Sum" else reference("sgd", 5)
    for got in _params(tmp_path):
        assert max_difference(got, expected) < 1e-5
    assert sum("mode server" in line for line in lines) == 2
    assert any(RESYNC_WARNING[:60] in line for line in lines)
