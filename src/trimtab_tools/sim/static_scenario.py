"""validate-sim's ``static`` scenario (``trimtab experiment stragglers --scenario
static``'s lbbsp run: 4 workers, 2 servers, the digits CNN with real compute plus 1 ms
a sample, worker 3 ``--slowdown`` times slower, global batch 128) on an unshaped test
bed, and the simulator on a model calibrated from what the workers measured: the speed
of the worker of the fastest median, each other worker's slowdown against it over each
:data:`RATIO_STEPS` steps (:func:`step_ratios`), the first steps' slowness. The
decisions compared: every worker's batch at each of the first steps (LB-BSP's).
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from trimtab.faults.stragglers import parse_stragglers
from trimtab.settings import BatchingSettings, JobSettings
from trimtab_tools.sim.agreement import FIRST, batches_agree
from trimtab_tools.sim.cluster import ClusterModel
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.job import SimJob
from trimtab_tools.sim.report import worker0_seconds

__all__ = ["RATIO_STEPS", "WARM_STEPS", "calibration", "measure", "simulate", "step_ratios"]

STATIC_WORKERS, STATIC_SERVERS, STATIC_BATCH, STATIC_SAMPLE_MS = 4, 2, 128, 1.0


def measure(epochs: int, slowdown: float) -> dict[str, Any]:
    """The lbbsp run of the ``static`` scenario on an unshaped bed. Blocks (a minute);
    raises RuntimeError where no bed can be made or the job fails."""
    from trimtab.examples.digits import make_cnn
    from trimtab.launch.hosts import Layout
    from trimtab.launch.job import Job, LaunchConfig
    from trimtab.launch.testbed import Testbed, unavailable
    from trimtab_tools.experiments.markers import STRAGGLERS_RESULT

    why = unavailable()
    if why is not None:
        raise RuntimeError(f"no test bed here: {why}")
    specs = [f"worker:{STATIC_WORKERS - 1}:slowdown={slowdown:g}@0-"]
    config = LaunchConfig(
        workers=STATIC_WORKERS, servers=STATIC_SERVERS, batching="lbbsp", stragglers=tuple(specs)
    )
    command = [
        sys.executable,
        "-m",
        "trimtab_tools.experiments._stragglers_worker",
        *("--epochs", str(epochs), "--batch", str(STATIC_BATCH), "--lr", "0.05"),
        *("--sample-ms", str(STATIC_SAMPLE_MS)),
    ]
    results: list[dict[str, Any]] = []
    log: list[str] = []

    def output(source: str, line: str) -> None:
        if line.startswith(STRAGGLERS_RESULT):
            results.append(json.loads(line[len(STRAGGLERS_RESULT) :]))
        else:
            log.append(f"[{source}] {line}")

    with Testbed(STATIC_SERVERS + STATIC_WORKERS) as bed:
        hosts = bed.hosts
        rate = bed.tcp_rate(STATIC_SERVERS, 0, 1.0)
        where = Layout(
            coordinator=hosts[0],
            servers=tuple(hosts[:STATIC_SERVERS]),
            workers=tuple(hosts[STATIC_SERVERS:]),
        )
        print("validate-sim: static / lbbsp on the bed ...", file=sys.stderr)
        status = Job(config, command, output=output, testbed=bed, layout=where).run()
    if status != 0 or len(results) != STATIC_WORKERS:
        raise RuntimeError(f"static lbbsp run failed (status {status}):\n" + "\n".join(log[-30:]))
    by_rank = sorted(results, key=lambda r: r["rank"])
    return {
        "rates": {"server": rate, "worker": rate},
        "tensor_bytes": [p.numel() * 4 for p in make_cnn(seed=0).parameters()],
        "slowdown": slowdown,
        "steps": by_rank[0]["steps"],
        "step_times": by_rank[0]["step_times"],
        "speeds": [statistics.median(r["speeds"]) for r in by_rank],
        "sizes": [r["sizes"][:FIRST] for r in by_rank],
        "step_speeds": [r["speeds"] for r in by_rank],
    }


#: The first steps whose measured speeds the static scenario's model takes as they were
#: (a process's first steps are slower: allocations, lazy initialisation).
WARM_STEPS = 2


#: Steps over which the static scenario's model takes one median ratio of speeds.
RATIO_STEPS = 10


def step_ratios(step_speeds: list[list[float]], block: int = RATIO_STEPS) -> list[list[float]]:
    """Each worker's slowdown against the worker of the fastest median speed (``ref``),
    for each ``block`` of steps: the median over the block's steps of ``ref``'s speed
    at a step over the worker's own (1.0 for ``ref``; the last block may be shorter,
    and one of fewer than half ``block`` steps joins the one before). Taken step by
    step, a load that slows every process of the machine for a while slows both sides
    of a ratio; taken block by block, a load that comes and goes during the run (CI's
    made a 3 x straggler's ratio of medians 4.7) changes the model when it changed the
    run. Pure; raises ValueError for no steps or a speed not > 0."""
    if not step_speeds or not all(step_speeds) or block < 1:
        raise ValueError("every worker needs at least one step's speed, and block >= 1")
    if min(min(v) for v in step_speeds) <= 0:
        raise ValueError("speeds must be > 0")
    ref = max(range(len(step_speeds)), key=lambda r: statistics.median(step_speeds[r]))
    steps = min(len(v) for v in step_speeds)
    edges = list(range(0, steps, block))
    if len(edges) > 1 and steps - edges[-1] < block / 2:
        edges.pop()
    bounds = list(zip(edges, [*edges[1:], steps], strict=True))
    return [
        [
            1.0 if r == ref else statistics.median(step_speeds[ref][k] / v[k] for k in range(a, b))
            for a, b in bounds
        ]
        for r, v in enumerate(step_speeds)
    ]


def calibration(m: dict[str, Any]) -> tuple[float, list[str]]:
    """The static scenario's model from what the workers measured: seconds a sample of
    the worker of the fastest median speed, a slowdown for each slower worker over each
    :data:`RATIO_STEPS` steps (:func:`step_ratios`; the ratio of medians throughout
    where an older output lacks the steps' speeds), and one for each worker's first
    :data:`WARM_STEPS` steps where slower than its median. No noise: the scatter of the
    workers' own speed figures (about 0.07, log space) taken as ``jitter`` made the
    simulated step 12% longer than the measured one, against 3.5% without (the figures
    scatter more than the steps). Pure."""
    per_sample = [1.0 / v for v in m["speeds"]]
    base = min(per_sample)
    steps = m.get("step_speeds") or []
    if len(steps) == len(per_sample) and len(steps[0]) > RATIO_STEPS:
        ratios = step_ratios(steps)
    else:
        ratios = [[c / base] for c in per_sample]
    specs = []
    for r, blocks in enumerate(ratios):
        for b, x in enumerate(blocks):
            if x > 1.0:
                until = "" if b == len(blocks) - 1 else str((b + 1) * RATIO_STEPS)
                specs.append(f"worker:{r}:slowdown={x:.4f}@{b * RATIO_STEPS}-{until}")
    for r, speeds in enumerate(m.get("step_speeds") or []):
        for k, v in enumerate(speeds[:WARM_STEPS]):
            if v * 1.001 < m["speeds"][r]:
                specs.append(f"worker:{r}:slowdown={m['speeds'][r] / v:.4f}@{k}-{k + 1}")
    return base, specs


def simulate(m: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    base, specs = calibration(m)
    settings = JobSettings(STATIC_WORKERS, STATIC_SERVERS, batching=BatchingSettings("lbbsp"))
    rate = m["rates"]["server"]
    cluster = ClusterModel(
        sample_s=base, forward_share=1.0, worker_nic_bps=rate, server_nic_bps=rate
    )
    job = SimJob(
        settings,
        cluster,
        tuple(parse_stragglers(specs)),
        tuple(m["tensor_bytes"]),
        m["steps"],
        STATIC_BATCH // STATIC_WORKERS,
        0,
    )
    sim = Simulation(job)
    sim.run()
    straggler = STATIC_WORKERS - 1
    simulated = [[b[r] for b in sim.trace.batches[:FIRST]] for r in range(STATIC_WORKERS)]
    decisions = {
        "calibrated_slowdowns": specs,
        "measured_straggler_batch": m["sizes"][straggler],
        "simulated_straggler_batch": simulated[straggler],
        "measured_batches": m["sizes"],
        "simulated_batches": simulated,
        "decisions_match": batches_agree([m["sizes"][straggler]], [simulated[straggler]]),
        "decisions_match_every_step": batches_agree(
            [m["sizes"][straggler]], [simulated[straggler]], settle=False
        ),
        "every_worker_agrees": batches_agree(m["sizes"], simulated),
    }
    return worker0_seconds(sim.trace, 0), decisions
