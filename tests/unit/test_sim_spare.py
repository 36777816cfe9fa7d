"""PSLD's figures while validate-sim's spare server starts, on a record and simulated."""

from __future__ import annotations

import math
import random

import pytest

from trimtab_tools.sim import spare, validate
from trimtab_tools.sim.engine import Simulation

MIB = 1 << 20


def _events(join: int, slowed: float, sigma: float, steps: int = 80) -> list[dict[str, object]]:
    """A PSLD record of four servers, server 2 the slow one (30 MB/s, the others 140),
    the spare (rank 4) joining after step ``join``: until then the fast servers read
    ``slowed`` times their speed and every figure scatters by ``sigma`` (log-normal),
    after it by a tenth of that."""
    rng = random.Random(3)
    events: list[dict[str, object]] = []
    for k in range(steps):
        starting = k <= join
        noise = sigma if starting else sigma / 10
        rows = []
        for s in range(4):
            speed = 30e6 if s == 2 else 140e6 * (slowed if starting else 1.0)
            nbytes = 2 * MIB
            wait = nbytes / (speed * math.exp(rng.gauss(0, noise)))
            rows.append([s, 2 * wait, wait, nbytes])
        for rank in (0, 1):
            events.append({"kind": "step", "rank": rank, "clock": k})
        events.append({"kind": "traffic", "clock": k, "servers": rows})
        if k == join:
            events.append({"kind": "member", "role": "server", "rank": 4, "state": "joined"})
    return events


def test_the_record_gives_the_fast_servers_level_and_scatter_while_the_spare_starts() -> None:
    got = spare.from_record(_events(20, 0.85, 0.12), servers=4, slow=2)
    assert got is not None
    assert got["join_step"] == 20
    assert got["fast_level"] == pytest.approx(0.85, abs=0.04)
    assert got["fast_upper_mbs"][1] == pytest.approx(140, rel=0.03)
    assert got["slow_upper_mbs"] == pytest.approx(30, rel=0.1)
    # PSLD plans the slow server's last chunks on the fast over the slow figure.
    assert got["fast_slow"][0] == pytest.approx(0.85 * 140 / 30, rel=0.1)
    assert got["fast_slow"][1] == pytest.approx(140 / 30, rel=0.1)
    during, after = got["scatter"]
    assert during == pytest.approx(0.12, rel=0.35)
    assert after < during / 3


def test_a_record_without_a_join_or_a_slow_server_gives_none() -> None:
    events = [e for e in _events(20, 0.85, 0.12) if e.get("kind") != "member"]
    assert spare.from_record(events, servers=4, slow=2) is None
    assert spare.from_record(_events(20, 0.85, 0.12), servers=4, slow=None) is None
    # A server past the job's own that joins is the spare; one of the first four is not.
    renamed = [
        {**e, "rank": 3} if e.get("kind") == "member" else e for e in _events(20, 0.85, 0.12)
    ]
    assert spare.from_record(renamed, servers=4, slow=2) is None


def test_a_simulated_run_is_measured_as_a_record_is() -> None:
    # The bandwidth job with the spare joining 12 steps after it was wanted: the model's
    # hosts have their own cores, so its fast servers read as fast before the join.
    m = {
        "rates": {"server": 76e6, "slow_server": 19e6, "worker": 2e9},
        "slow_server": 3,
        "tensor_bytes": [MIB] * 8,
        "steps": 60,
        "join_steps": 12,
    }
    sim = Simulation(validate.bandwidth_job(m, 100e-6, calm=False))
    sim.run()
    got = spare.from_trace(sim.trace, servers=4, slow=3)
    assert got is not None
    joined = next(d.clock for d in sim.trace.decisions if d.kind == "server_joined")
    assert got["join_step"] == joined - 1
    assert got["fast_level"] == pytest.approx(1.0, abs=0.05)
    assert 3 < got["fast_slow"][0] < 7
    assert spare.from_trace(sim.trace, servers=4, slow=None) is None
    # Every figure the trace kept has its step.
    for server, row in sim.trace.bounds.items():
        assert len(sim.trace.bound_clocks[server]) == len(row)
