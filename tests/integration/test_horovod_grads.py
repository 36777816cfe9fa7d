"""Issue 33: what a Horovod script finds in ``.grad`` and in its optimizer's state, against
Horovod's documented behaviour, over real processes (one ``trimtab run`` job of 2 workers
and 2 servers runs every case of horovod_grads_worker.py; its docstring says what each
does). Each assertion names what Horovod gives."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import processes_of
from tests.integration.test_equivalence import _run
from trimtab.launch.job import LaunchConfig

SCRIPT = Path(__file__).with_name("horovod_grads_worker.py")
WORKERS = 2
#: How many fresh optimizers race their first step against a state_dict() read.
RACE_ROUNDS = 30


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("grads")
    config = LaunchConfig(workers=WORKERS, servers=2, chunk_bytes=64)
    _run(config, [sys.executable, str(SCRIPT), str(out), str(RACE_ROUNDS)], deadline_s=100.0)
    assert processes_of(config.job) == []
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORKERS)]


@pytest.mark.timeout(150)
def test_broadcast_optimizer_state_leaves_zero_gradients(results: list[dict[str, Any]]) -> None:
    """Horovod's test_broadcast_state_no_grad: a fresh optimizer's broadcast leaves each
    trained parameter's .grad a zero tensor (broadcast() takes it), an untrained one None."""
    for got in results:
        case = got["no_grad"]
        assert case["untrained_grad_is_none"]
        assert case["grad"] == [0.0] * 4
        assert case["broadcast_equal"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", ["zeroed", "accumulated", "overlap", "passes", "sum"])
def test_grad_after_step_is_the_allreduced_gradient(
    results: list[dict[str, Any]], case: str
) -> None:
    """After every step(), .grad holds Horovod's allreduce of the gradients backward left
    (the mean; with op=Sum the sum), on every rank, in server mode: zero_grad() between
    steps or not (the next backward adds to the mean), with model=, with two backward
    passes a step, and for a parameter only rank 0 has a gradient for."""
    for got in results:
        result = got[f"mean_{case}"]
        assert result["mode"] == "server"
        assert result["none_after"] == []
        assert result["checked"] == 4 * 6  # every step, every parameter
        assert result["worst"] < 1e-6, result


@pytest.mark.timeout(150)
def test_load_state_dict_takes_a_state_without_every_parameter(
    results: list[dict[str, Any]],
) -> None:
    """torch (and Horovod's resume flow) loads a fresh optimizer's state_dict() (empty
    state) and SGD without momentum's: the parameters are left with a fresh state."""
    for got in results:
        case = got["load_fresh"]
        assert case["trained_state"] == 4
        assert case["errors"] == {}
        assert case["adam"] == {"state_keys": [], "lr": 0.02, "momentum_buffers_none": True}
        assert case["sgd"]["lr"] == 0.02 and case["sgd"]["momentum_buffers_none"]
        assert case["steps_after_fresh"] == [1.0]  # Adam counted again from a fresh state


@pytest.mark.timeout(150)
def test_state_dict_right_after_the_first_step_holds_every_parameter(
    results: list[dict[str, Any]],
) -> None:
    """Every rank's state_dict() right after the first step() holds every parameter's
    state, RACE_ROUNDS times, with rank 0's hand-over of that state forced to come late."""
    for got in results:
        case = got["state_after_first_step"]
        assert case["rounds"] == RACE_ROUNDS
        assert case["missing"] == []
