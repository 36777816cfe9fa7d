"""Issue 18's scripts: what Horovod users write around the step, run unchanged but the
import under ``trimtab run``, give the parameters of the same script in one process
over the same global batches (tests/horovod_patterns.py has the scripts)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.horovod_patterns import PATTERNS, reference
from tests.integration.test_equivalence import _run
from trimtab.launch.job import LaunchConfig

SCRIPT = Path(__file__).with_name("horovod_script.py")
TOLERANCE = 1e-5


def _job(patterns: str, out: Path, workers: int = 2, servers: int = 2) -> None:
    config = LaunchConfig(workers=workers, servers=servers, chunk_bytes=512)
    _run(config, [sys.executable, str(SCRIPT), patterns, str(out)])


def _assert_matches(out: Path, expected: dict[str, torch.Tensor], workers: int = 2) -> None:
    for rank in range(workers):
        got = torch.load(out / f"rank{rank}.pt")
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            diff = (got[name].double() - value.double()).abs().max().item()
            assert diff < TOLERANCE, f"rank {rank}: {name} off by {diff}"


SIMPLE = [name for name in PATTERNS if name != "checkpoint"]


@pytest.fixture(scope="module")
def first_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every pattern, one after the other in one job (as a script with several models
    and optimizers would): the checkpoint's first phase (rank 0 saves it), then every
    other pattern; each writes under OUT/PATTERN/."""
    out = tmp_path_factory.mktemp("patterns")
    _job(",".join(["checkpoint:first", *SIMPLE]), out)
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pattern", SIMPLE)
def test_horovod_pattern_matches_one_process(first_job: Path, tmp_path: Path, pattern: str) -> None:
    _assert_matches(first_job / pattern, reference(pattern, tmp_path))


@pytest.mark.timeout(180)
def test_checkpoint_by_rank0_resumed_in_a_new_job_matches_a_run_never_stopped(
    first_job: Path, tmp_path: Path
) -> None:
    """Rank 0 saves model and optimizer (momentum buffers live on the servers), the job
    ends; a new job's rank 0 loads them and broadcasts: the end is the unstopped run's."""
    saved = first_job / "checkpoint" / "checkpoint.pt"
    assert torch.load(saved)["optimizer"]["state"], "the checkpoint holds no optimizer state"
    shutil.copy(saved, tmp_path / "checkpoint.pt")
    _job("checkpoint:resume", tmp_path)
    _assert_matches(tmp_path, reference("checkpoint", tmp_path))
