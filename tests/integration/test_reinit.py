"""``trimtab.shutdown()`` then ``trimtab.init()`` in one script, over real processes and
TCP (``trimtab run --workers 2 --servers 1``): the workers train, leave, join again,
build a new DistributedOptimizer over the same model and train on; the parameters are
those of one process that never stopped (the optimizer's state stayed on the server),
and the job still ends by itself once the workers' processes exit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import Setup, max_difference, reference
from tests.integration.test_equivalence import _run
from trimtab.launch.job import LaunchConfig

SCRIPT = Path(__file__).with_name("reinit_worker.py")
STEPS, FIRST, LR_DROP_AT = 8, 4, 6  # as in reinit_worker.py

CASES = [
    # (optimizer, per-worker batch sizes, the ranks that re-init)
    ("sgd", (5, 19), (0, 1)),  # momentum: its state must go on, not start again
    ("adam", (12, 12), (0,)),  # one worker re-inits while the other trains on
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("optimizer", "sizes", "ranks"),
    # (one worker re-initing, in the slow tier: both re-init in the default run)
    [pytest.param(*c, marks=pytest.mark.slow if len(c[2]) == 1 else ()) for c in CASES],
    ids=[f"{o}-reinit{''.join(map(str, r))}" for o, _, r in CASES],
)
def test_training_after_shutdown_and_init_matches_one_process_never_stopped(
    tmp_path: Path, optimizer: str, sizes: tuple[int, ...], ranks: tuple[int, ...]
) -> None:
    config = LaunchConfig(workers=2, servers=1, chunk_bytes=512, verbose=True)
    command = [
        sys.executable,
        str(SCRIPT),
        optimizer,
        ",".join(map(str, sizes)),
        ",".join(map(str, ranks)),
        str(tmp_path),
    ]
    lines = _run(config, command, deadline_s=120.0)
    expected = reference(Setup(optimizer, sizes, steps=STEPS, lr_drop_at=LR_DROP_AT))
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
        seen = json.loads((tmp_path / f"seen{rank}.json").read_text())
        assert seen["clock"] == FIRST and seen["final_clock"] == STEPS, seen
        if rank in ranks:
            assert seen["initialized_after_shutdown"] is False and seen["rank_after_init"] == rank
    # The job ended by itself (every worker's process said DONE), not by the launcher's
    # teardown; and LEAVE did not end it (the re-inits would have found no job).
    assert any("every worker is done; shutting the job down" in line for line in lines)
    assert sum("left the job for now" in line for line in lines) == len(ranks) + 2
    assert processes_of(config.job) == []
