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
from trimtab.settings import ElasticSettings, JobSettings, PlacementSettings
from trimtab_tools.sim import spare, static_scenario
from trimtab_tools.sim.agreement import (
    held_epochs,
    map_changes,
    maps_agree,
    record_events,
    record_facts,
)
from trimtab_tools.sim.cluster import ClusterModel
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.job import SimJob
from trimtab_tools.sim.noise import RecordedNoise, from_figures, meter_push_s, thinned
from trimtab_tools.sim.noise import recorded as recorded_noise
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
#: The coordinator's decision delay where a measured run lacks its record's
#: (``--measured`` outputs before 2026-11-29's fifth round): the records of 11-28's and
#: 11-29's sittings published the map 20 to 26 ms after the last report.
DECISION_S = 0.022
#: A server's load meter's busy seconds per push where a measured run lacks its
#: record's (``--measured`` outputs before 2026-11-29's sixth round): the calm runs of
#: that session's sittings counted 460 to 580 us.
METER_PUSH_S = 560e-6


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
    from trimtab_tools.experiments.psld_bed import SLOW_HOST, rank_on, shaped_bed

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
            "slow_server": bed.tcp_rate(worker, SLOW_HOST, 1.0),
            "worker": bed.tcp_rate(worker, worker + 1, 1.0),
        }
        slow_address = bed.hosts[SLOW_HOST].address
        print("validate-sim: bandwidth / no_straggler on the bed ...", file=sys.stderr)
        bed.shape(SLOW_HOST, rate_mbit=ns.link * 8 / 1e6)  # every server at full rate
        calm = psld.one_run("no_straggler", "bandwidth", ns, bed)
        bed.shape(SLOW_HOST, rate_mbit=ns.link / ns.slowdown * 8 / 1e6)
        print("validate-sim: bandwidth / psld on the bed ...", file=sys.stderr)
        run = psld.one_run("psld", "bandwidth", ns, bed)
    # The bed's servers register in any order: the slow server is the rank that served
    # on the slow host (the record's addresses; else the one the coordinator named a
    # straggler), and the server wanted joined join_steps steps later.
    facts = record_facts(run.get("record"), psld.SERVERS)
    slow = rank_on(facts.get("addrs", {}), slow_address)
    if slow is None:
        slow = SLOW_HOST if facts.get("slow_server") is None else facts["slow_server"]
    events = record_events(run.get("record"))
    return {
        "calibration_step_times": calm["step_times"],
        # PSLD's figures' noise on the calm run (every server alike: the machine's).
        "noise": recorded_noise(record_events(calm.get("record"))).to_json(),
        "meter_push_s": meter_push_s(record_events(calm.get("record"))),
        "psld_noise_scatter": recorded_noise(events).scatters(),
        # PSLD's figures while the spare server started on the bed's cores, and after.
        "spare_start": spare.from_record(events, psld.SERVERS, slow),
        "rates": rates,
        "slow_server": slow,
        "join_s": facts.get("join_s"),
        "join_steps": facts.get("join_steps"),
        "decision_s": facts.get("decision_s"),
        "maps": facts.get("maps", {}),
        "tensor_bytes": psld.model("bandwidth"),
        "steps": steps,
        "step_times": run["step_times"],
        "epochs": run["epochs"],
        "migrations": run["migrations"],
        "servers": run["servers"],
    }


# -- the simulations ---------------------------------------------------------------------


def bandwidth_job(
    m: dict[str, Any],
    message_s: float,
    *,
    calm: bool,
    jitter: float = 0.0,
    noise: RecordedNoise | None = None,
    clean: bool | None = None,
) -> SimJob:
    """The bandwidth scenario's job on ``m``'s measured rates: psld and the slow server,
    or (``calm``) greedy with every server at full rate, as the experiment's
    no_straggler run; ``message_s``, ``jitter``, ``noise`` (``measurement_noise``) and
    ``clean`` (``clean_figures``; default: where ``noise`` has deviations to draw) as
    :class:`ClusterModel`'s, the join in ``m``'s steps where measured, else its
    seconds. Never blocks; raises KeyError for a malformed ``m``."""
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
        pushes_in_order=True,  # ...to optimizer.step(), which pushes them in order
        worker_nic_bps=rates["worker"],
        server_nic_bps=rates["server"],
        message_s=message_s,
        jitter=jitter,
        join_s=m.get("join_s") or ClusterModel.join_s,
        join_steps=m.get("join_steps"),
        decision_s=DECISION_S if m.get("decision_s") is None else m["decision_s"],
        meter_push_s=METER_PUSH_S if m.get("meter_push_s") is None else m["meter_push_s"],
        measurement_noise=noise or RecordedNoise(),
        # PSLD's figures' noise: the record's alone.
        clean_figures=bool(noise and (noise.bounds or noise.windows)) if clean is None else clean,
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


def measurement_noise(m: dict[str, Any], message_s: float, jitter: float) -> RecordedNoise:
    """The noise of PSLD's figures the simulation lacks: what ``m["noise"]`` recorded on
    the calm run, less what the calm run simulated at ``message_s`` and ``jitter``
    scatters by itself with figures free of the jitter (``clean_figures``: next to
    nothing; :func:`~trimtab_tools.sim.noise.thinned`); none where ``m`` has no record
    of it (an older output). Blocks (CPU, a tenth of a second)."""
    if not m.get("noise"):
        return RecordedNoise()
    job = bandwidth_job(m, message_s, calm=True, jitter=jitter, clean=True)
    sim = Simulation(job)
    sim.run()
    own = from_figures(sim.trace.bounds, sim.trace.windows).scatters()
    return thinned(RecordedNoise.from_json(m["noise"]), own)


def _simulate_bandwidth(m: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    from trimtab_tools.experiments import psld

    message_s, jitter = calibrate(m)
    noise = measurement_noise(m, message_s, jitter)
    sim = Simulation(bandwidth_job(m, message_s, calm=False, jitter=jitter, noise=noise))
    sim.run()
    after = held_epochs(sim.trace.epochs, sim.trace.learned)  # as a worker records them
    measured = map_changes(m["epochs"], {int(k): v for k, v in m.get("maps", {}).items()})
    simulated = map_changes(after, sim.trace.maps)
    decisions = {
        "calibrated_message_us": round(message_s * 1e6, 1),
        "calibrated_jitter": round(jitter, 4),
        "calibrated_join_s": m.get("join_s") or ClusterModel.join_s,
        "calibrated_join_steps": m.get("join_steps"),
        "calibrated_decision_ms": round(sim.job.cluster.decision_s * 1e3, 1),
        "decision_from_record": m.get("decision_s") is not None,
        "calibrated_meter_push_us": round(sim.job.cluster.meter_push_s * 1e6, 1)
        if sim.job.cluster.meter_push_s is not None
        else None,
        "meter_from_record": m.get("meter_push_s") is not None,
        "recorded_noise": (
            RecordedNoise.from_json(m["noise"]).scatters() if m.get("noise") else None
        ),
        "drawn_noise": noise.scatters(),
        "simulated_noise": from_figures(sim.trace.bounds, sim.trace.windows).scatters(),
        "slow_server": m["slow_server"],
        # The spare's start on the bed (not modelled): its figures beside the model's.
        "spare_start": {
            "bed": m.get("spare_start"),
            "simulated": spare.from_trace(sim.trace, psld.SERVERS, m["slow_server"]),
        },
        "measured_map_changes": [c["step"] for c in measured],
        "simulated_map_changes": [c["step"] for c in simulated],
        "measured_changes": measured,
        "simulated_changes": simulated,
        "decisions_match": maps_agree(measured, simulated),
        "measured_migrations": m["migrations"],
        "simulated_migrations": sim.trace.migrations,
    }
    return worker0_seconds(sim.trace, 0), decisions


def simulate(scenario: str, measured: dict[str, Any]) -> dict[str, Any]:
    """The simulator on ``measured``'s calibration; both median steps (the first step
    left out), ``step_error`` and the first steps' decisions. Blocks (CPU, a second).
    Raises KeyError for a malformed ``measured``."""
    simulated_run = _simulate_bandwidth if scenario == "bandwidth" else static_scenario.simulate
    steps, decisions = simulated_run(measured)
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
            m = static_scenario.measure(args.epochs, args.slowdown)
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
