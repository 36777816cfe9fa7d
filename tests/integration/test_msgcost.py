"""``trimtab bench msgcost``: trimtab's worker and server and the lean PS run in this
process over loopback TCP, each checks its SGD result, and the CPU per chunk comes back
split by role."""

from __future__ import annotations

import argparse

import pytest

from trimtab_tools.bench import msgcost


@pytest.mark.timeout(120)
def test_it_measures_both_and_splits_the_cpu_by_role() -> None:
    result = msgcost.measure(steps=5, rounds=1)
    assert result["auth"] is True  # (a user's job's default: trimtab's roles hold a key)
    assert result["chunks_per_step"] == msgcost.TENSORS * msgcost.CHUNKS_PER_TENSOR
    for which in ("trimtab", "lean"):
        parts = result[which]
        # Each role did work of its own, and the step took time.
        assert parts["worker_us"] > 0 and parts["server_us"] > 0, parts
        assert parts["wall_us"] > 0, parts
    assert result["worker_over_lean"] == pytest.approx(
        result["trimtab"]["worker_us"] / result["lean"]["worker_us"], abs=0.01
    )


@pytest.mark.slow  # (a benchmark's mode, 12 s; the in-process mode stays in the default run)
@pytest.mark.timeout(180)
def test_with_processes_each_server_runs_apart_and_is_counted_there() -> None:
    result = msgcost.measure(steps=5, rounds=1, processes=True)
    assert result["processes"] is True
    for which in ("trimtab", "lean"):
        parts = result[which]
        # The server's CPU is read from its own process: it did work there, and so did
        # ZeroMQ's I/O threads (counted in "other", even the lean server's, which end
        # before the count).
        assert parts["worker_us"] > 0 and parts["server_us"] > 0, parts
        assert parts["other_us"] > 0 and parts["wall_us"] > 0, parts


@pytest.mark.slow  # (the insecure mode, measured beside the default)
@pytest.mark.timeout(120)
def test_without_auth_it_measures_the_roles_without_a_key() -> None:
    result = msgcost.measure(steps=5, rounds=1, auth=False)
    assert result["auth"] is False
    assert result["trimtab"]["worker_us"] > 0 and result["trimtab"]["server_us"] > 0


def test_it_refuses_chunks_that_would_travel_inside_the_header(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = argparse.Namespace(chunk_bytes=4096, steps=5, rounds=1, json=True)
    assert msgcost.main(args) == 2
    assert "chunk_bytes >= 8192" in capsys.readouterr().err
