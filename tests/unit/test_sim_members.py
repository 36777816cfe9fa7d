"""Workers dying and joining in a simulated elastic job (``--fault``), as the
coordinator's elastic boundary lives them."""

from __future__ import annotations

import pytest

from trimtab.errors import ConfigError
from trimtab.faults.kills import parse_faults
from trimtab.settings import (
    BatchingSettings,
    ConsistencySettings,
    ElasticSettings,
    JobSettings,
)
from trimtab_tools.sim.cluster import ClusterModel
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.job import MIB, SimJob
from trimtab_tools.sim.members import Members


def _job(faults: str, *, batching: str = "equal", max_workers: int = 6) -> SimJob:
    settings = JobSettings(
        4,
        2,
        batching=BatchingSettings(batching),
        elastic=ElasticSettings(min_workers=2, max_workers=max_workers),
    )
    cluster = ClusterModel(join_s=0.5)  # steps of about 40 ms: a join within 15 steps
    specs = tuple(parse_faults(faults))
    return SimJob(settings, cluster, tensor_bytes=(MIB,) * 4, steps=40, faults=specs)


def test_a_lost_worker_is_dropped_and_the_same_global_batch_split_over_the_others() -> None:
    sim = Simulation(_job("worker:1:kill@10"))
    sim.run()
    assert sim.ranks == [0, 2, 3]
    assert sim.trace.decisions[0].kind == "worker_lost" and sim.trace.decisions[0].clock == 10
    assert sim.trace.batch_max[10] == 32  # step 10 completes over the others' samples
    assert sorted(sim.trace.sizes_last) == [42, 43, 43]  # from step 11: 128 over 3
    steps = [b - a for a, b in zip(sim.trace.ends, sim.trace.ends[1:], strict=False)]
    assert steps[12] > 1.2 * steps[5]  # each of the others computes more


def test_workers_join_at_the_first_boundary_after_they_are_ready() -> None:
    sim = Simulation(_job("worker:+2@5", max_workers=5))
    sim.run()
    joined = [d for d in sim.trace.decisions if d.kind == "worker_joined"]
    assert [d.detail["workers"] for d in joined] == [[4]]  # --max-workers 5: one of two
    assert joined[0].at >= sim.trace.starts[5] + sim.job.cluster.join_s
    assert sim.ranks == [0, 1, 2, 3, 4] and sum(sim.trace.sizes_last) == 128


def test_lbbsp_sizes_a_joined_worker_from_the_others() -> None:
    sim = Simulation(_job("worker:+1@3", batching="lbbsp"))
    sim.run()
    assert sim.ranks == [0, 1, 2, 3, 4] and sum(sim.trace.sizes_last) == 128
    assert min(sim.trace.sizes_last) > 20  # a new worker starts as fast as the mean


def test_faults_the_simulator_cannot_live_are_refused() -> None:
    def members(faults: str, elastic: bool = True) -> Members:
        return Members(4, parse_faults(faults), elastic=elastic, min_workers=2, max_workers=4)

    with pytest.raises(ConfigError, match="no server deaths"):
        members("server:1:kill@3")
    with pytest.raises(ConfigError, match="4 workers"):
        members("worker:7:kill@3")
    with pytest.raises(ConfigError, match="elastic job"):
        members("worker:1:kill@3", elastic=False)
    with pytest.raises(ConfigError, match="--min-workers 2"):
        m = members("worker:1:kill@3;worker:2:kill@3;worker:3:kill@3")
        m.lost_at(3)
    with pytest.raises(ConfigError, match="bsp only"):
        SimJob(
            JobSettings(
                4, 2, consistency=ConsistencySettings("asp"), elastic=ElasticSettings(min_workers=2)
            )
        )
