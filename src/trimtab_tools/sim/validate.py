"""``trimtab experiment validate-sim``: real jobs on the multi-host test bed against the
simulator on a model of them calibrated from measured speeds.

Two scenarios, each one real run on a test bed (:mod:`trimtab.launch.testbed`: every
role on a host of its own, TCP between them):

* ``bandwidth`` (``trimtab experiment psld --scenario bandwidth --testbed``'s psld run:
  2 workers, 4 servers and a spare, 8 tensors of 1 MiB in 256 KiB chunks, 20 ms of
  emulated compute a step, server links shaped by ``tc`` to 640 Mbit/s and server 3's
  to a quarter of it). Calibration: the TCP rate of one stream from a worker's host to
  a server's, to the slow server's and to the other worker's host, measured on the bed
  before the job; they are the simulated NICs and the slow server's ``bandwidth``.
  Then two figures fitted to the no_straggler run (greedy, every link at full rate)
  measured on the same bed just before: the CPU a message costs
  (``ClusterModel.message_s``: on two shared cores the path is bound by CPU per
  message, which changes with the machine's load), so that the simulated run takes
  its median step, and the machine's noise (``ClusterModel.jitter``), so that its steps
  spread as the measured ones (the noise is what makes PSLD's trials fail and retry).
* ``static`` (``trimtab experiment stragglers --scenario static``'s lbbsp run: 4
  workers, 2 servers, the digits CNN with real compute plus 1 ms a sample, worker 3
  ``--slowdown`` times slower, global batch 128), on an unshaped bed. Calibration: each
  worker's median compute speed (samples/s, the workers' own figures) becomes its
  simulated speed (the fastest the ``--sample-ms``, the others ``slowdown`` specs); the
  links the measured TCP rate between two hosts.

Reported per scenario: both median steps (worker 0's, the first step left out),
``step_error`` = (simulated - measured) / measured, and the first 20 steps'
decisions side by side: the steps after which the map changed (``bandwidth``), the
straggler's batch size at each step (``static``). ``--measured FILE`` re-simulates the
measurements of an earlier ``--json`` output instead of running the jobs (no bed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.faults.stragglers import parse_stragglers
from trimtab.settings import BatchingSettings, ElasticSettings, JobSettings, PlacementSettings
from trimtab_tools.sim.agreement import (
    FIRST,
    batches_agree,
    map_changes,
    maps_agree,
    record_facts,
)
from trimtab_tools.sim.cluster import ClusterModel
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.job import SimJob
from trimtab_tools.sim.report import worker0_seconds

__all__ = [
    "SCENARIOS",
    "add_arguments",
    "bandwidth_job",
    "calibrate",
    "main",
    "simulate",
    "step_error",
]

SCENARIOS = ("bandwidth", "static")
#: The bandwidth scenario's job (``trimtab experiment psld``'s defaults).
PSLD_JOB = {"steps": 150, "compute_ms": 20.0, "link": 80e6, "slowdown": 4.0}
STATIC_WORKERS, STATIC_SERVERS, STATIC_BATCH, STATIC_SAMPLE_MS = 4, 2, 128, 1.0


def step_error(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured, rounded. Raises ValueError for a measured
    step that is not > 0."""
    if not measured > 0:
        raise ValueError(f"a measured step must be > 0, got {measured}")
    return round((simulated - measured) / measured, 4)


# -- the real runs ---------------------------------------------------------------------


def _measure_bandwidth(steps: int) -> dict[str, Any]:
    """The psld run of the ``bandwidth`` scenario on a shaped bed, and the bed's rates.
    Blocks (a minute); raises RuntimeError where no bed can be made or the job fails."""
    from trimtab_tools.experiments import psld
    from trimtab_tools.experiments.psld_bed import SLOW_SERVER, shaped_bed

    ns = argparse.Namespace(
        steps=steps,
        warmup=0,
        compute_ms=PSLD_JOB["compute_ms"],
        link=PSLD_JOB["link"],
        slowdown=PSLD_JOB["slowdown"],
        chunk_bytes=256 << 10,
        move_every=40,
    )
    shape = ("bandwidth", psld.SERVERS, psld.WORKERS, ns.link, ns.slowdown)
    with shaped_bed(*shape) as bed:
        worker = psld.SERVERS + 1  # the first worker host, after the spare server's
        rates = {
            "server": bed.tcp_rate(worker, 0, 1.0),
            "slow_server": bed.tcp_rate(worker, SLOW_SERVER, 1.0),
            "worker": bed.tcp_rate(worker, worker + 1, 1.0),
        }
        print("validate-sim: bandwidth / no_straggler on the bed ...", file=sys.stderr)
        bed.shape(SLOW_SERVER, rate_mbit=ns.link * 8 / 1e6)  # every server at full rate
        calm = psld.one_run("no_straggler", "bandwidth", ns, bed)
        bed.shape(SLOW_SERVER, rate_mbit=ns.link / ns.slowdown * 8 / 1e6)
        print("validate-sim: bandwidth / psld on the bed ...", file=sys.stderr)
        run = psld.one_run("psld", "bandwidth", ns, bed)
    # The bed's hosts register in any order: the slow host's server is the one the
    # coordinator named a straggler (its record), and the server wanted took join_s.
    facts = record_facts(run.get("record"), psld.SERVERS)
    return {
        "calibration_step_times": calm["step_times"],
        "rates": rates,
        "slow_server": SLOW_SERVER if facts.get("slow_server") is None else facts["slow_server"],
        "join_s": facts.get("join_s"),
        "maps": facts.get("maps", {}),
        "tensor_bytes": psld.model("bandwidth"),
        "steps": steps,
        "step_times": run["step_times"],
        "epochs": run["epochs"],
        "migrations": run["migrations"],
        "servers": run["servers"],
    }


def _measure_static(epochs: int, slowdown: float) -> dict[str, Any]:
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
        "step_speeds": [r["speeds"][:FIRST] for r in by_rank],
    }


# -- the simulations ---------------------------------------------------------------------


def bandwidth_job(
    m: dict[str, Any], message_s: float, *, calm: bool, jitter: float = 0.0
) -> SimJob:
    """The bandwidth scenario's job on ``m``'s measured rates: psld and the slow server,
    or (``calm``) greedy with every server at full rate, as the experiment's
    no_straggler run; ``message_s`` and ``jitter`` as :class:`ClusterModel`'s. Never
    blocks; raises KeyError for a malformed ``m``."""
    from trimtab_tools.experiments import psld

    rates = m["rates"]
    settings = JobSettings(
        psld.WORKERS,
        psld.SERVERS,
        placement=PlacementSettings("greedy" if calm else "psld", 256 << 10),
        elastic=ElasticSettings(max_servers=psld.SERVERS + (0 if calm else 1)),
    )
    cluster = ClusterModel(
        sample_s=PSLD_JOB["compute_ms"] / 1e3,
        forward_share=1.0,  # the script sleeps, then hands every gradient over
        worker_nic_bps=rates["worker"],
        server_nic_bps=rates["server"],
        message_s=message_s,
        jitter=jitter,
        join_s=m.get("join_s") or ClusterModel.join_s,
        # The bed's tc shapes the slow server's link: the kernel's, not a throttle in
        # the server (which would count as its busy time).
        server_links=() if calm else ((m["slow_server"], rates["slow_server"]),),
    )
    return SimJob(settings, cluster, (), tuple(m["tensor_bytes"]), m["steps"], 1, 0)


def _calm_steps(m: dict[str, Any], message_s: float, jitter: float) -> list[float]:
    sim = Simulation(bandwidth_job(m, message_s, calm=True, jitter=jitter))
    sim.run()
    return worker0_seconds(sim.trace, 0)[1:]


def _spread(steps: list[float]) -> float:
    """The standard deviation of the steps' logarithms (their spread, in proportion)."""
    return statistics.pstdev(math.log(t) for t in steps)


#: The grid the calibration searches: CPU a message (seconds), and the noise.
MESSAGE_GRID = tuple(i * 25e-6 for i in range(17))  # 0 to 400 us
JITTER_GRID = tuple(i * 0.025 for i in range(13))  # 0 to 0.3


def calibrate(
    m: dict[str, Any],
    messages: tuple[float, ...] | None = None,
    jitters: tuple[float, ...] | None = None,
) -> tuple[float, float]:
    """The CPU a message costs and the machine's noise, fitted to the measured
    no_straggler run (``m["calibration_step_times"]``): the pair of the grid whose
    simulated run comes closest to its median step and, a quarter as much, to the
    spread of its steps (both change the median and the spread, so they are fitted
    together; default :data:`MESSAGE_GRID` and :data:`JITTER_GRID`). Blocks (CPU,
    about 7 s on the default grid)."""
    measured = m["calibration_step_times"][1:]
    target, spread = statistics.median(measured), _spread(measured)

    def miss(pair: tuple[float, float]) -> float:
        steps = _calm_steps(m, *pair)
        off = (statistics.median(steps) - target) / target
        wide = (_spread(steps) - spread) / max(spread, 0.01)
        return float(off * off + 0.25 * wide * wide)

    grid = [(x, j) for x in messages or MESSAGE_GRID for j in jitters or JITTER_GRID]
    return min(grid, key=miss)


def _simulate_bandwidth(m: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    message_s, jitter = calibrate(m)
    sim = Simulation(bandwidth_job(m, message_s, calm=False, jitter=jitter))
    sim.run()
    after = [*sim.trace.epochs[1:], sim.trace.epochs[-1]]  # the map routed by after a step
    measured = map_changes(m["epochs"], {int(k): v for k, v in m.get("maps", {}).items()})
    simulated = map_changes(after, sim.trace.maps)
    decisions = {
        "calibrated_message_us": round(message_s * 1e6, 1),
        "calibrated_jitter": round(jitter, 4),
        "calibrated_join_s": m.get("join_s") or ClusterModel.join_s,
        "slow_server": m["slow_server"],
        "measured_map_changes": [c["step"] for c in measured],
        "simulated_map_changes": [c["step"] for c in simulated],
        "measured_changes": measured,
        "simulated_changes": simulated,
        "decisions_match": maps_agree(measured, simulated),
        "measured_migrations": m["migrations"],
        "simulated_migrations": sim.trace.migrations,
    }
    return worker0_seconds(sim.trace, 0), decisions


#: The first steps whose measured speeds the static scenario's model takes as they were
#: (a process's first steps are slower: allocations, lazy initialisation).
WARM_STEPS = 2


def _static_calibration(m: dict[str, Any]) -> tuple[float, list[str]]:
    """The static scenario's model from what the workers measured: the fastest median
    seconds a sample, a slowdown for each slower worker, and one for each worker's first
    :data:`WARM_STEPS` steps where slower than its median. No noise: the scatter of the
    workers' own speed figures (about 0.07, log space) taken as ``jitter`` made the
    simulated step 12% longer than the measured one, against 3.5% without (the figures
    scatter more than the steps). Pure."""
    per_sample = [1.0 / v for v in m["speeds"]]
    base = min(per_sample)
    specs = [f"worker:{r}:slowdown={c / base:.4f}@0-" for r, c in enumerate(per_sample) if c > base]
    for r, speeds in enumerate(m.get("step_speeds") or []):
        for k, v in enumerate(speeds[:WARM_STEPS]):
            if v * 1.001 < m["speeds"][r]:
                specs.append(f"worker:{r}:slowdown={m['speeds'][r] / v:.4f}@{k}-{k + 1}")
    return base, specs


def _simulate_static(m: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    base, specs = _static_calibration(m)
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
        "every_worker_agrees": batches_agree(m["sizes"], simulated),
    }
    return worker0_seconds(sim.trace, 0), decisions


def simulate(scenario: str, measured: dict[str, Any]) -> dict[str, Any]:
    """The simulator on ``measured``'s calibration; both median steps (the first step
    left out), ``step_error`` and the first steps' decisions. Blocks (CPU, a second).
    Raises KeyError for a malformed ``measured``."""
    steps, decisions = (_simulate_bandwidth if scenario == "bandwidth" else _simulate_static)(
        measured
    )
    real = statistics.median(measured["step_times"][1:])
    simulated = statistics.median(steps[1:])
    return {
        "measured_median_step_s": round(real, 5),
        "simulated_median_step_s": round(simulated, 5),
        "step_error": step_error(simulated, real),
        "decisions": decisions,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure (or load) each scenario and simulate it. Blocks (minutes with the bed);
    raises RuntimeError where a job fails or no bed can be made, ConfigError for a bad
    ``--measured`` file."""
    wanted = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown or not wanted:
        raise ConfigError(f"--scenarios: choose among {list(SCENARIOS)}, got {args.scenarios!r}")
    saved: dict[str, Any] = {}
    if args.measured:
        try:
            saved = json.loads(Path(args.measured).read_text())["measured"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"--measured {args.measured}: not a validate-sim output ({exc})"
            ) from None
    out: dict[str, Any] = {"measured": {}, "scenarios": {}, "step_error": {}}
    for scenario in wanted:
        if scenario in saved:
            m = saved[scenario]
        elif args.measured:
            raise ConfigError(f"--measured {args.measured} has no {scenario!r} run")
        elif scenario == "bandwidth":
            m = _measure_bandwidth(args.steps)
        else:
            m = _measure_static(args.epochs, args.slowdown)
        out["measured"][scenario] = m
        try:
            out["scenarios"][scenario] = result = simulate(scenario, m)
        except KeyError as exc:
            raise ConfigError(
                f"--measured {args.measured}: its {scenario!r} run lacks {exc} (an older output?)"
            ) from None
        out["step_error"][scenario] = result["step_error"]
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``trimtab experiment validate-sim``'s flags. Never blocks."""
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="bandwidth,static")
    p.add_argument("--steps", type=int, default=PSLD_JOB["steps"], help="bandwidth: steps (150)")
    p.add_argument("--epochs", type=int, default=12, help="static: epochs (12: 132 steps)")
    p.add_argument("--slowdown", type=float, default=3.0, help="static: the straggler's (3)")
    p.add_argument("--measured", metavar="JSON", help="re-simulate an earlier --json output")
    p.add_argument("--json", action="store_true", help="last line: one JSON object")


def main(args: argparse.Namespace) -> int:
    """Run ``trimtab experiment validate-sim``; 0, or 1 where a real job failed."""
    try:
        out = run(args)
    except RuntimeError as exc:
        print(f"trimtab experiment validate-sim: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out), flush=True)
        return 0
    for scenario, r in out["scenarios"].items():
        print(
            f"  {scenario:>9}: measured {r['measured_median_step_s']:.4f} s, simulated "
            f"{r['simulated_median_step_s']:.4f} s a step: error {r['step_error']:+.1%}"
        )
        for key, value in r["decisions"].items():
            print(f"             {key}: {value}")
    return 0
