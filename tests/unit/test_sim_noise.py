"""validate-sim's calibration from a run record: PSLD's figures' measurement noise drawn
again in the simulator, the join in steps, the slow host's rank, and the straggler's
ratio step by step (issue 38). Pure functions and small simulations; fast."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from trimtab_tools.experiments.psld_bed import rank_on
from trimtab_tools.sim import agreement, noise, static_scenario, validate
from trimtab_tools.sim.engine import Simulation

MIB = 1 << 20


def _noisy_events(sigma: float, steps: int = 120, seed: int = 1) -> list[dict[str, object]]:
    """A record's traffic and load events of four servers, server 3 at a quarter of the
    others' speed, every figure scattered by a log-normal factor of ``sigma``."""
    rng = random.Random(seed)
    events: list[dict[str, object]] = []
    busy = [0.0] * 4
    moved = [0.0] * 4
    for k in range(steps):
        rows = []
        for s in range(4):
            base, nbytes = (20e6 if s == 3 else 80e6), 2 * MIB
            span = nbytes / (base * math.exp(rng.gauss(0, sigma)))  # the lower bound's
            wait = nbytes / (2 * base * math.exp(rng.gauss(0, sigma)))  # the upper's
            rows.append([s, span, wait, nbytes])
            busy[s] += nbytes / (300e6 * math.exp(rng.gauss(0, sigma)))
            moved[s] += nbytes
            events.append({"kind": "load", "server": s, "busy_s": busy[s], "bytes": moved[s]})
        events.append({"kind": "traffic", "clock": k, "servers": rows})
    return events


def test_the_recorded_noise_is_each_figures_scatter_about_its_servers_level() -> None:
    recorded = noise.recorded(_noisy_events(0.15)).scatters()
    # The slow server's level is not noise: every kind comes out near 0.15.
    assert recorded["lower"] == pytest.approx(0.15, rel=0.2)
    assert recorded["upper"] == pytest.approx(0.15, rel=0.2)
    assert recorded["windows"] == pytest.approx(0.15, rel=0.2)
    steady = noise.deviations([100.0] * 20 + [50.0] * 20)  # a level change, no noise
    assert noise.scatter(steady) == 0.0
    assert noise.recorded([]) == noise.RecordedNoise()
    again = noise.RecordedNoise.from_json(
        json.loads(json.dumps(noise.recorded(_noisy_events(0.1)).to_json()))
    )
    assert again.scatters() == noise.recorded(_noisy_events(0.1)).scatters()


def test_thinning_leaves_what_the_simulation_does_not_scatter_by_itself() -> None:
    recorded = noise.recorded(_noisy_events(0.15))
    have = recorded.scatters()
    own = {k: 0.6 * v for k, v in have.items()}
    left = noise.thinned(recorded, own).scatters()
    for kind in have:  # variances add: 0.6^2 + 0.8^2 = 1
        assert left[kind] == pytest.approx(0.8 * have[kind], rel=0.01)
    louder = {k: 2 * v for k, v in have.items()}
    assert noise.thinned(recorded, louder).scatters() == {"lower": 0, "upper": 0, "windows": 0}


def _record(**extra: object) -> dict[str, object]:
    return {
        "rates": {"server": 76e6, "slow_server": 19e6, "worker": 2e9},
        "slow_server": 3,
        "tensor_bytes": [MIB] * 8,
        "steps": 60,
        **extra,
    }


def test_the_simulated_figures_scatter_as_the_recorded_ones_whatever_the_jitter() -> None:
    record = _record(noise=noise.recorded(_noisy_events(0.06, steps=200)).to_json())
    # A loaded machine's step times fit a jitter of 0.25: figures made of those timings
    # do not scatter as the bed's own (0.06 here, as on the bed at such a load): more
    # before the workers' pushes took turns (0.08 and up), less since (0.04).
    calm = Simulation(validate.bandwidth_job(record, 50e-6, calm=True, jitter=0.25))
    calm.run()
    own = noise.from_figures(calm.trace.bounds, calm.trace.windows).scatters()
    assert own["lower"] != pytest.approx(0.06, rel=0.25)
    drawn = validate.measurement_noise(record, 50e-6, 0.25)
    runs = []
    for _ in range(2):
        sim = Simulation(validate.bandwidth_job(record, 50e-6, calm=True, jitter=0.25, noise=drawn))
        runs.append(sim.run())
    # PSLD's figures are the jitter-free model's with the record's noise drawn on them.
    total = noise.from_figures(runs[0].bounds, runs[0].windows).scatters()
    assert total["lower"] == pytest.approx(0.06, rel=0.25)
    assert total["upper"] == pytest.approx(0.06, rel=0.25)
    # (A step's busy time here is under the 5 ms a window needs: windows span two or
    # three steps, and their draws average.)
    assert 0.02 < total["windows"] < 0.075
    assert runs[0].bounds == runs[1].bounds  # seeded: a run repeats
    # The timings keep the jitter: the steps are the calm run's.
    assert runs[0].ends == calm.trace.ends


def test_a_server_calibrated_to_join_in_steps_joins_that_many_steps_later() -> None:
    def joined_after(steps: int) -> int:
        sim = Simulation(validate.bandwidth_job(_record(join_steps=steps), 0.0, calm=False))
        sim.run()
        clocks = {d.kind: d.clock for d in sim.trace.decisions}
        return clocks["server_joined"] - clocks["server_wanted"]

    assert joined_after(4) - joined_after(0) == 4
    assert joined_after(9) - joined_after(0) == 9


def test_the_record_gives_the_join_in_steps_and_the_slow_hosts_rank(tmp_path: Path) -> None:
    events = [
        {
            "kind": "member",
            "role": "server",
            "rank": 0,
            "state": "active",
            "addr": "tcp://10.77.3.4:7001",
        },
        {
            "kind": "member",
            "role": "server",
            "rank": 1,
            "state": "active",
            "addr": "tcp://10.77.3.1:7001",
        },
        {"kind": "step", "rank": 0, "clock": 6},
        {"kind": "servers_wanted", "target": 5, "t": 2.0},
        {"kind": "step", "rank": 0, "clock": 7},
        {"kind": "step", "rank": 1, "clock": 9},
        {"kind": "member", "role": "server", "rank": 4, "state": "joined", "t": 4.0},
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    facts = agreement.record_facts(tmp_path, 4)
    assert (facts["join_s"], facts["join_steps"]) == (2.0, 3)
    # The slow host is 10.77.3.4: the server that registered first serves there.
    assert rank_on(facts["addrs"], "10.77.3.4") == 0
    assert rank_on(facts["addrs"], "10.77.3.1") == 1
    assert rank_on(facts["addrs"], "10.77.3.40") is None
    assert rank_on({}, "10.77.3.4") is None


def test_the_stragglers_ratio_is_taken_step_by_step_and_follows_a_load_that_comes() -> None:
    fast = [100.0] * 40
    slow = [100 / 3] * 20 + [20.0] * 20  # from step 20 a load slows the straggler alone
    common = [1.0] * 5 + [0.5] * 10 + [1.0] * 25  # every process at half speed a while
    speeds = [[v * c for v, c in zip(w, common, strict=True)] for w in (fast, fast, slow)]
    ratios = static_scenario.step_ratios(speeds)
    assert ratios[0] == ratios[1] == [1.0] * 4
    assert ratios[2] == pytest.approx([3.0, 3.0, 5.0, 5.0])
    assert static_scenario.step_ratios([[1.0] * 24, [0.5] * 24])[1] == [2.0, 2.0]  # 4 steps join
    with pytest.raises(ValueError):
        static_scenario.step_ratios([[1.0], []])
    base, specs = static_scenario.calibration(
        {"speeds": [100.0, 100.0, 25.0], "step_speeds": speeds}
    )
    assert base == 0.01
    assert specs == [
        "worker:2:slowdown=3.0000@0-10",
        "worker:2:slowdown=3.0000@10-20",
        "worker:2:slowdown=5.0000@20-30",
        "worker:2:slowdown=5.0000@30-",
    ]


def test_the_meters_busy_seconds_per_push_come_from_the_load_events() -> None:
    events = [
        {"kind": "load", "server": 0, "busy_s": 0.0, "bytes": 0.0, "requests": 0},
        {"kind": "load", "server": 0, "busy_s": 0.001, "bytes": 1.0, "requests": 2},
        {"kind": "load", "server": 0, "busy_s": 0.011, "bytes": 9.0, "requests": 22},
        {"kind": "load", "server": 1, "busy_s": 0.002, "bytes": 1.0, "requests": 1},
        {"kind": "load", "server": 1, "busy_s": 0.008, "bytes": 9.0, "requests": 11},
        {"kind": "step", "clock": 0},
    ]
    # 0.5 ms a request on server 0, 0.6 on server 1: the median of the two.
    assert noise.meter_push_s(events) == pytest.approx(0.00055)
    assert noise.meter_push_s(events[:2]) is None


def test_busy_windows_are_kept_as_the_speed_estimator_takes_them() -> None:
    windows: dict[int, list[float]] = {}
    keeper = noise.WindowRecord(windows)
    keeper.take(0, 0.002, 1e6)  # under MIN_BUSY_S: not yet a window
    keeper.take(0, 0.006, 3e6)
    keeper.take(0, 0.016, 4e6)
    assert windows == {0: [3e6 / 0.006, 1e6 / 0.010]}


def test_the_bounds_are_drawn_again_as_recorded_every_server_together_in_order() -> None:
    # Issue 38: the bed's figures move together and over several steps; drawn server by
    # server and step by step, the simulated PSLD moved chunks the bed's did not.
    events = [
        e
        for e in _noisy_events(0.1, steps=40)
        if not (e["kind"] == "traffic" and e["clock"] == 7)  # a step with no figures
    ]
    recorded = noise.recorded(events)
    assert len(recorded.series) == 39 and all(len(step) == 4 for step in recorded.series)
    again = noise.RecordedNoise.from_json(json.loads(json.dumps(recorded.to_json())))
    assert np.allclose(again.series, recorded.series, atol=1e-5)
    # A run's step k takes the record's step start + k, each server one recorded
    # server's pair: consecutive steps are consecutive recorded steps, all servers'.
    series = np.exp(np.array(recorded.series))
    draws = noise.Draws(recorded, seed=3, count=4)

    def same(got: np.ndarray, step: np.ndarray) -> bool:
        return bool(np.allclose(np.sort(got, axis=0), np.sort(step, axis=0)))

    start = [i for i in range(len(series)) if same(draws.at(0)[0], series[i])]
    assert len(start) == 1
    for k in range(1, 5):
        assert same(draws.at(k)[0], series[(start[0] + k) % len(series)])
    # Without a series (an older output): each server's pair drawn from every pair.
    older = noise.RecordedNoise(recorded.bounds, recorded.windows)
    pairs = np.exp(np.array(recorded.bounds))
    for row in noise.Draws(older, seed=3, count=4).at(0)[0]:
        assert np.isclose(pairs, row).all(axis=1).any()
