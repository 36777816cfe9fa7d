"""Issue 38, sixth round: a simulated map races a step's first push to the old owner's
inbound queue (not to the push's last byte), a server's load meter counts the busy
seconds calibrated from a run record, and the simulated map epochs are compared where
a real worker records them."""

from __future__ import annotations

import numpy as np
import pytest

from trimtab.errors import ConfigError
from trimtab_tools.sim import agreement
from trimtab_tools.sim.cluster import ClusterModel
from trimtab_tools.sim.cuts import cut_now
from trimtab_tools.sim.datapath import StepInput, step_times


def _step(**changes: object) -> StepInput:
    sizes = np.full(4, 1e6)
    base: dict[str, object] = dict(
        starts=np.zeros(2),
        compute=np.array([0.1, 0.1]),
        sizes=sizes,
        owners=np.array([0, 1, 0, 1]),
        shares=np.ones(4),
        available=np.full(4, -np.inf),
        proc=np.full(2, 1e12),
        cap=np.full(2, np.inf),
        delay=np.zeros(2),
        update_bps=1e12,
        worker_nic_bps=1e12,
        server_nic_bps=1e9,
        latency_s=0.001,
        link=np.array([1e7, np.inf]),  # server 0 behind a 10 MB/s shaped link
        in_order=True,
    )
    base.update(changes)
    return StepInput(**base)  # type: ignore[arg-type]


def test_a_map_behind_a_push_in_the_queue_loses_the_race_however_slow_the_link() -> None:
    t = step_times(_step())
    # Every gradient at the compute's end (0.1 s): the first push enters server 0's
    # queue a latency later, and is in 0.1 s after that (1 MB at 10 MB/s).
    assert t.first_queued[0] == pytest.approx(0.101, rel=1e-4)
    assert t.first_in[0] == pytest.approx(0.201, rel=1e-3)
    moving, was = np.array([0, 2]), np.array([0, 1, 0, 1])
    # A map entering the queue between the two is read after that push: the round is
    # under way, nothing is cut at it (the rule before raced the last byte and cut).
    assert cut_now(moving, was, t.first_queued, 0.15).size == 0
    assert cut_now(moving, was, t.first_in, 0.15).tolist() == [0, 2]
    # Ahead of every push of the step, it is cut at the round under way.
    assert cut_now(moving, was, t.first_queued, 0.1005).tolist() == [0, 2]


def test_the_meter_counts_its_calibrated_seconds_per_push_and_leaves_the_timing() -> None:
    model = step_times(_step())
    metered = step_times(_step(meter_push_s=0.002))
    # Each server merges 2 chunks from each of 2 workers: 4 pushes at 2 ms.
    assert metered.busy_s == pytest.approx([0.008, 0.008])
    assert not np.allclose(model.busy_s, metered.busy_s)
    assert np.array_equal(model.ends, metered.ends)
    moved = step_times(_step(meter_push_s=0.002, moved=np.array([True, False, False, False])))
    assert moved.busy_s[0] == pytest.approx(0.004)  # a moved push is one answer (no CPU here)
    with pytest.raises(ConfigError, match="meter_push_s"):
        ClusterModel(meter_push_s=-1.0)


def test_a_workers_record_shows_a_map_from_the_step_it_routes_by_it() -> None:
    # Decided during step 1 (on step 0's reports), in force from step 2: a worker's
    # record shows it at step 2, or at step 1 where step 1's pushes were answered moved.
    epochs = [0, 0, 1, 1, 1]
    assert agreement.held_epochs(epochs, {}) == epochs
    assert agreement.held_epochs(epochs, {1: 1}) == [0, 1, 1, 1, 1]
    maps = {0: [0, 1], 1: [1, 1]}
    held = agreement.held_epochs(epochs, {})
    assert [c["step"] for c in agreement.map_changes(held, maps)] == [2]
    cut = agreement.held_epochs(epochs, {1: 1})
    assert agreement.map_changes(cut, maps) == [{"step": 1, "moves": [[0, 0, 1]]}]
