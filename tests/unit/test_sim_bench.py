"""``trimtab bench policies``: every policy decision at 1,000 workers and 100 servers
under issue 38's 100 ms."""

from __future__ import annotations

import argparse
import json

import pytest

from trimtab_tools.bench import policies


def test_every_decision_is_timed_at_a_thousand_workers_and_a_hundred_servers() -> None:
    out = policies.measure(1000, 100, history=20, repeat=1)
    assert {"psld.decide", "batching.lbbsp", "detection.lag", "placement.hash"} <= set(out["calls"])
    assert all(c["max_ms"] > 0 and c["max_cpu_ms"] >= 0 for c in out["calls"].values())
    # Under 100 ms each (issue 38) is the benchmark's figure (`trimtab bench policies`,
    # BENCHMARKS.md), not asserted here: the wall time of one call took 764 ms once with
    # the suite's jobs beside it, and even the calling thread's CPU time 266 ms once
    # (2026-11-29; 21 ms alone), probably its least-squares fit waiting for cores the suite
    # holds. A red CI run from a flake costs a landing.
    print("slowest CPU ms:", out["slowest_cpu_ms"], out["calls"])


def test_the_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    policies.add_arguments(parser)
    args = parser.parse_args(["-w", "8", "-s", "2", "--repeat", "1", "--json"])
    assert policies.main(args) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["workers"] == 8 and out["slowest_ms"] >= out["calls"]["psld.decide"]["max_ms"]
    assert policies.main(parser.parse_args(["--repeat", "0"])) == 2
