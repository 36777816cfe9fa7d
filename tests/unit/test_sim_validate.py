"""``trimtab experiment validate-sim``: the calibration and the comparison on records
made by the simulator itself (fast), and the real runs on the test bed (slow tier)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from trimtab.errors import ConfigError
from trimtab_tools.sim import agreement, validate
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.report import worker0_seconds

MIB = 1 << 20


def _bandwidth_record(message_s: float, jitter: float = 0.0) -> dict[str, object]:
    """A bandwidth record whose runs the simulator made with ``message_s`` and
    ``jitter``."""
    record: dict[str, object] = {
        "rates": {"server": 76e6, "slow_server": 19e6, "worker": 2e9},
        "slow_server": 3,
        "tensor_bytes": [MIB] * 8,
        "steps": 40,
    }
    calm = Simulation(validate.bandwidth_job(record, message_s, calm=True, jitter=jitter))
    calm.run()
    record["calibration_step_times"] = worker0_seconds(calm.trace, 0)
    psld = Simulation(validate.bandwidth_job(record, message_s, calm=False, jitter=jitter))
    psld.run()
    record["step_times"] = worker0_seconds(psld.trace, 0)
    # As a worker records them: the map it routes by when each step ends.
    record["epochs"] = agreement.held_epochs(psld.trace.epochs, psld.trace.learned)
    record["migrations"] = psld.trace.migrations
    return record


def test_the_message_cost_and_the_noise_are_fitted_back_from_a_run_they_made() -> None:
    grid = {"messages": (0.0, 75e-6, 150e-6, 225e-6), "jitters": (0.0, 0.05, 0.1, 0.15)}
    assert validate.calibrate(_bandwidth_record(150e-6, 0.1), **grid) == (150e-6, 0.1)
    assert validate.calibrate(_bandwidth_record(0.0), **grid) == (0.0, 0.0)


@pytest.fixture(autouse=True)
def _small_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A coarse calibration grid: the default one takes seconds."""
    monkeypatch.setattr(validate, "MESSAGE_GRID", (0.0, 100e-6, 200e-6))
    monkeypatch.setattr(validate, "JITTER_GRID", (0.0, 0.1))


def test_the_simulator_predicts_its_own_runs_and_decisions() -> None:
    out = validate.simulate("bandwidth", _bandwidth_record(100e-6, 0.1))
    assert out["step_error"] == 0.0  # the same model, the same noise: the same run
    d = out["decisions"]
    assert d["measured_map_changes"] == d["simulated_map_changes"] and d["measured_map_changes"]
    assert (d["calibrated_message_us"], d["calibrated_jitter"]) == (100.0, 0.1)
    static = {
        "rates": {"server": 2e9, "worker": 2e9},
        "tensor_bytes": [1152, 128, 73728, 256, 40960, 40],
        "steps": 30,
        "step_times": [0.05] * 30,
        "speeds": [800.0, 800.0, 800.0, 200.0],
        "sizes": [[32] * 20] * 4,
    }
    out = validate.simulate("static", static)
    assert out["decisions"]["simulated_straggler_batch"][:3] == [32, 32, 10]  # from step 2
    assert out["decisions"]["calibrated_slowdowns"] == ["worker:3:slowdown=4.0000@0-"]
    assert out["simulated_median_step_s"] == pytest.approx(128 / 2600, rel=0.05)  # B / sum v
    assert out["step_error"] == pytest.approx(
        (out["simulated_median_step_s"] - 0.05) / 0.05, abs=1e-3
    )


def test_step_error_is_relative_to_the_measured_step() -> None:
    assert validate.step_error(0.09, 0.1) == pytest.approx(-0.1)
    with pytest.raises(ValueError, match="measured"):
        validate.step_error(0.1, 0.0)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    validate.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_an_earlier_output_is_simulated_again_without_the_bed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "v.json"
    saved.write_text(json.dumps({"measured": {"bandwidth": _bandwidth_record(0.0, 0.1)}}))
    args = _args("--scenarios", "bandwidth", "--measured", str(saved), "--json")
    assert validate.main(args) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["step_error"] == {"bandwidth": 0.0}
    with pytest.raises(ConfigError, match="no 'static' run"):
        validate.run(_args("--measured", str(saved)))
    with pytest.raises(ConfigError, match="--scenarios"):
        validate.run(_args("--scenarios", "skew"))
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ConfigError, match="not a validate-sim output"):
        validate.run(_args("--measured", str(tmp_path / "bad.json")))


@pytest.mark.slow
def test_the_simulator_runs_beside_the_bed_and_predicts_its_step_within_a_half() -> None:
    from trimtab.launch.testbed import unavailable

    if (why := unavailable()) is not None:
        pytest.skip(f"no test bed here: {why}")
    out = validate.run(_args("--steps", "60", "--epochs", "6"))
    # Issue 38's goal is 10%, measured by `trimtab experiment validate-sim` (BENCHMARKS.md
    # has its figures and sittings); a test on a loaded machine cannot hold that, nor a
    # fifth (+0.239 on 2026-11-29 with helpers at work). A half still catches a broken
    # model (a protocol step left out, a link's bytes counted twice: 2 x or more).
    for scenario, error in out["step_error"].items():
        assert abs(error) < 0.5, (scenario, out["scenarios"][scenario])
    bandwidth = out["scenarios"]["bandwidth"]["decisions"]
    # Both runs moved chunks; when and how often is printed, not asserted: the bed's own
    # moves follow its timings' noise (whether it cuts the first migration at the round
    # under way, one-step dips of a fast server: 2 to 4 map changes in the first 20
    # steps in the sittings of 2026-11-29), and so does whether LB-BSP's decisions match
    # (CI's load calibrated the straggler at 4.7 x where the bed gives it 3 x). A red CI
    # run from a flake costs a landing.
    assert bandwidth["measured_map_changes"] and bandwidth["simulated_map_changes"], bandwidth
    static = out["scenarios"]["static"]["decisions"]
    print("validate-sim decisions:", json.dumps({"static": static, "bandwidth": bandwidth}))
    assert "decisions_match" in static and "decisions_match" in bandwidth


def test_the_same_decisions_are_the_same_moves_within_a_step_and_batches_within_two() -> None:
    maps = {1: [0, 1, 2, 3], 2: [0, 0, 2, 3], 3: [0, 0, 2, 2]}
    measured = agreement.map_changes([1, 1, 2, 2, 3], maps)
    assert measured == [
        {"step": 2, "moves": [[1, 1, 0]]},
        {"step": 4, "moves": [[3, 3, 2]]},
    ]
    later = agreement.map_changes([1, 1, 1, 2, 2, 3], maps)  # a step later each
    assert agreement.maps_agree(measured, later)
    elsewhere = [{"step": 2, "moves": [[1, 1, 2]]}, {"step": 4, "moves": [[3, 3, 2]]}]
    assert not agreement.maps_agree(measured, elsewhere)
    assert not agreement.maps_agree(measured, measured[:1])
    assert agreement.batches_agree([[32, 12, 10]], [[32, 10, 11]])
    assert not agreement.batches_agree([[32, 13, 10]], [[32, 10, 10]])


def test_one_steps_outlier_of_a_batch_is_noise_two_steps_are_a_decision() -> None:
    # The bed's straggler got 13 for one step (one noisy speed sample answered), then
    # its level again: the same decisions as a steady 10. Two steps at 13, or 13 at
    # the first decided step (no neighbour before it to tell), are a different one.
    equal, steady = [32, 32], [32, 32, 10, 10, 10, 10, 10, 10]
    one = [32, 32, 10, 10, 13, 10, 10, 10]
    assert agreement.settled(one) == [32, 32, 10, 10, 10, 10, 10, 10]
    assert agreement.batches_agree([one], [steady])
    assert not agreement.batches_agree([one], [steady], settle=False)  # the raw rule
    assert not agreement.batches_agree([[32, 32, 10, 10, 13, 13, 10, 10]], [steady])
    assert not agreement.batches_agree([[*equal, 13, 10, 10, 10, 10, 10]], [steady])
    assert not agreement.batches_agree([[*equal, 10, 10, 10, 13, 13, 13]], [steady])
    assert agreement.settled([32, 32, 10, 12, 9]) == [32, 32, 10, 10, 9]  # ends kept


def test_a_run_record_gives_the_maps_the_join_and_the_slow_server(tmp_path: Path) -> None:
    events = [
        {"kind": "placement", "epoch": 1, "owners": [0, 1, 2, 3], "t": 1.0},
        {"kind": "servers_wanted", "target": 5, "t": 2.0},
        {"kind": "straggler", "role": "server", "rank": 2, "t": 2.5},
        {"kind": "straggler", "role": "server", "rank": 4, "t": 2.6},
        {"kind": "member", "role": "server", "rank": 4, "state": "joined", "t": 4.25},
        # Two migrations started 20 and 30 ms after the last report before each.
        {"kind": "step", "rank": 0, "clock": 3, "t": 5.0},
        {"kind": "step", "rank": 1, "clock": 3, "t": 5.01},
        {"kind": "migration", "phase": "start", "epoch": 2, "t": 5.03},
        {"kind": "migration", "phase": "done", "epoch": 2, "t": 5.5},
        {"kind": "step", "rank": 1, "clock": 4, "t": 6.0},
        {"kind": "migration", "phase": "start", "epoch": 3, "t": 6.03},
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    facts = agreement.record_facts(tmp_path, 4)
    assert facts == {
        "maps": {"1": [0, 1, 2, 3]},
        "addrs": {},
        "join_s": 2.25,
        "join_steps": 0,  # no step reported in between
        "slow_server": 2,
        "decision_s": 0.025,
    }
    assert agreement.record_facts(tmp_path / "absent", 4) == {}
