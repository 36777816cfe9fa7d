"""Issue 18 over real processes and TCP: a checkpoint saved by rank 0 the Horovod way and
resumed in a new job; Horovod's clipping and mixed-precision recipes; op=Sum and
gradient_predivide_factor. Each compared with one process running plain torch over the
same global batches, to 1e-5. Every case runs in one job (each with a model and an
optimizer of its own), and the checkpoints are resumed in a second one."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import global_batches, loss_of, make_model, max_difference
from tests.integration.test_equivalence import _run
from tests.state_job import OPTIMIZERS, reference
from trimtab.frontend.params import RESYNC_WARNING
from trimtab.launch.job import LaunchConfig

SCRIPT = Path(__file__).with_name("state_worker.py")

#: The cases of the first job (tests/integration/state_worker.py says how to read them):
#: two checkpoints saved after 4 steps, Horovod's recipes, op=Sum and predivide.
FIRST = [
    "adam:plain:0:4",
    "rmsprop:plain:0:4",
    "adam:clip:0:6",
    "adam:amp:0:6",
    "sgd:resync:0:5:Sum:1",
    "sgd:resync:0:5:Average:4",
]
#: The second job: the checkpoints resumed, 4 more steps each.
RESUMED = ["adam:plain:4:8", "rmsprop:plain:4:8"]


def _job(out: Path, cases: list[str]) -> list[str]:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=512)
    lines = _run(config, [sys.executable, str(SCRIPT), str(out), *cases], deadline_s=80.0)
    assert processes_of(config.job) == []
    return lines


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], dict[str, Any]]:
    """The first job: the output directory, its lines, and each checkpoint as it saved
    it (the second job overwrites it)."""
    out = tmp_path_factory.mktemp("state")
    lines = _job(out, FIRST)
    saved = {
        name: torch.load(out / f"{name}-plain" / "checkpoint.pt", weights_only=True)
        for name in ("adam", "rmsprop")
    }
    return out, lines, saved


@pytest.fixture(scope="module")
def jobs(
    first: tuple[Path, list[str], dict[str, Any]],
) -> tuple[Path, list[str], dict[str, Any]]:
    """Both jobs: the second resumes the first's checkpoints. (Two fixtures, so that
    each job is the setup of its own test: the tests of the first job come first.)"""
    _job(first[0], RESUMED)
    return first


def _params(out: Path) -> list[list[torch.Tensor]]:
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("recipe", ["clip", "amp"])
def test_horovod_recipes_changing_gradients_after_synchronize(
    first: tuple[Path, list[str], dict[str, Any]], recipe: str
) -> None:
    """synchronize(); clip_grad_norm_ (or GradScaler.unscale_ of a 2**16-scaled loss);
    with skip_synchronize(): step(). The same as one process doing it with plain torch;
    the job says it switched to summation mode."""
    out, lines, _ = first
    expected = reference("adam", 6, recipe)
    for got in _params(out / f"adam-{recipe}"):
        assert max_difference(got, expected) < 1e-5
    assert sum(f"adam-{recipe} mode summation" in line for line in lines) == 2
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


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("op", "predivide"), [("Sum", "1"), ("Average", "4")])
def test_sum_and_predivide_and_horovods_warning(
    first: tuple[Path, list[str], dict[str, Any]], op: str, predivide: str
) -> None:
    """op=Sum: the servers' update uses the sum of the two workers' gradients; with
    gradient_predivide_factor=4 the mean again. The last step calls synchronize() and
    then step() without skip_synchronize(): Horovod's warning, and no second push (the
    parameters are still right)."""
    out, lines, _ = first
    expected = _summed_reference(5) if op == "Sum" else reference("sgd", 5)
    for got in _params(out / f"sgd-resync-{op}-{predivide}"):
        assert max_difference(got, expected) < 1e-5
    assert sum(f"sgd-resync-{op}-{predivide} mode server" in line for line in lines) == 2
    assert any(RESYNC_WARNING[:60] in line for line in lines)


@pytest.mark.timeout(200)
# (SGD with momentum's checkpoint: tests/integration/test_horovod_patterns.py)
@pytest.mark.parametrize("name", ["adam", "rmsprop"])
def test_checkpoint_resumed_in_a_new_job_equals_an_unstopped_run(
    jobs: tuple[Path, list[str], dict[str, Any]], name: str
) -> None:
    """Job 1: 4 steps, rank 0 saves {"model", "optimizer"}. Job 2 (new coordinator and
    servers): rank 0 loads both, broadcast_parameters + broadcast_optimizer_state (the
    other rank's optimizer is fresh), 4 more steps. Both ranks end where one process
    running 8 steps does."""
    out, _, saved = jobs
    assert saved[name]["optimizer"]["state"], "the checkpoint holds no optimizer state"
    expected = reference(name, 8)
    for got in _params(out / f"{name}-plain"):
        assert max_difference(got, expected) < 1e-5
