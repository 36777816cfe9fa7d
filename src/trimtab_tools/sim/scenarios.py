"""The experiments' straggler scenarios at any cluster size, and the policy pairs run
side by side under them.

* ``bandwidth`` (``trimtab experiment psld``'s): server 3 (the last, with fewer)
  moves at ``1 / slowdown`` of its NIC;
* ``moving``: that slow server changes every ``move_every`` steps;
* ``static`` (``trimtab experiment stragglers``'): worker 3 (the last, with fewer)
  computes ``slowdown`` times slower throughout;
* ``transient``: worker 3 is that slow over the middle third of the steps;
* ``drifting``: workers 2 and 3 drift (random walks of 0.3 and 0.4);
* ``none``: nobody straggles.

The pairs: ``psld_vs_hash`` (placement, under ``bandwidth``) and ``lbbsp_vs_bsp``
(batch sizing: ``lbbsp`` against ``equal``, both bsp, under ``static``). Pure: specs
are made, not run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from trimtab.errors import ConfigError
from trimtab.faults.stragglers import StragglerSpec, parse_stragglers
from trimtab.settings import BatchingSettings, PlacementSettings
from trimtab_tools.sim.asynchronous import AsyncSimulation
from trimtab_tools.sim.decisions import Policies
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.job import SimJob
from trimtab_tools.sim.report import summary

__all__ = ["PAIRS", "SCENARIOS", "pair", "run_job", "scenario", "simulation_for"]

SCENARIOS = ("none", "bandwidth", "moving", "static", "transient", "drifting")


@dataclasses.dataclass(frozen=True)
class Pair:
    """Two runs that differ in one policy: ``field`` (``placement`` or ``batching``)
    set to ``policy`` against ``baseline``, under ``scenario``."""

    field: str
    policy: str
    baseline: str
    scenario: str


PAIRS = {
    "psld_vs_hash": Pair("placement", "psld", "hash", "bandwidth"),
    "lbbsp_vs_bsp": Pair("batching", "lbbsp", "equal", "static"),
}


def scenario(
    name: str,
    workers: int,
    servers: int,
    steps: int,
    *,
    slowdown: float = 4.0,
    nic_bps: float = 1.25e9,
    move_every: int = 40,
) -> list[StragglerSpec]:
    """The straggler specs of scenario ``name`` for a job of that size. Raises
    :class:`ConfigError` for an unknown name or a slowdown below 1."""
    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; choose one of {list(SCENARIOS)}")
    if not slowdown >= 1:
        raise ConfigError(f"--slowdown must be at least 1, got {slowdown}")
    server, worker = min(3, servers - 1), min(3, workers - 1)
    slow = nic_bps / slowdown
    texts: list[str] = []
    if name == "bandwidth":
        texts = [f"server:{server}:bandwidth={slow:g}B/s"]
    elif name == "moving":
        for i, start in enumerate(range(0, steps, move_every)):
            texts.append(f"server:{i % servers}:bandwidth={slow:g}B/s@{start}-{start + move_every}")
    elif name == "static":
        texts = [f"worker:{worker}:slowdown={slowdown:g}@0-"]
    elif name == "transient":
        start, end = steps // 3, max(2 * steps // 3, steps // 3 + 1)
        texts = [f"worker:{worker}:slowdown={slowdown:g}@{start}-{end}"]
    elif name == "drifting":
        texts = [f"worker:{min(2, workers - 1)}:drift=0.3", f"worker:{worker}:drift=0.4"]
    return parse_stragglers(texts)


def simulation_for(job: SimJob) -> Simulation | AsyncSimulation:
    """The simulation of ``job``: step by step if its consistency policy is
    ``synchronous`` (asked, as the roles ask it), else worker by worker."""
    policies = Policies(job.settings)
    if policies.consistency.synchronous:
        return Simulation(job, policies)
    return AsyncSimulation(job, policies)


def run_job(job: SimJob) -> dict[str, Any]:
    """Simulate ``job``; its :func:`summary`. Blocks (CPU); raises what a policy raises."""
    start = time.perf_counter()
    sim = simulation_for(job)
    sim.run()
    return summary(sim, time.perf_counter() - start)


def pair(name: str, base: SimJob, slowdown: float) -> dict[str, Any]:
    """Run pair ``name`` (:data:`PAIRS`) on ``base``'s cluster and model; the two runs'
    figures and ``ratio``: the policy's throughput over the baseline's. Blocks (CPU)."""
    p = PAIRS[name]
    s = base.settings
    specs = scenario(
        p.scenario,
        s.workers,
        s.servers,
        base.steps,
        slowdown=slowdown,
        nic_bps=base.cluster.server_nic_bps,
    )
    runs: dict[str, Any] = {"scenario": p.scenario}
    for policy in (p.policy, p.baseline):
        if p.field == "placement":
            settings = dataclasses.replace(
                s, placement=PlacementSettings(policy, s.placement.chunk_bytes)
            )
        else:
            settings = dataclasses.replace(s, batching=BatchingSettings(policy))
        job = dataclasses.replace(base, settings=settings, stragglers=tuple(specs))
        runs[policy] = run_job(job)
    a, b = runs[p.policy], runs[p.baseline]
    runs["ratio"] = round(a["throughput_samples_per_s"] / b["throughput_samples_per_s"], 4)
    return runs
