"""Fast checks of the TCP-ceiling, gloo-allreduce and PS-arithmetic baselines (a few
seconds in all)."""

from __future__ import annotations

import math

import pytest
import torch

from trimtab_tools.bench import baselines
from trimtab_tools.bench.baselines import gloo, leanps


@pytest.mark.timeout(60)
def test_tcp_ceiling_small_transfer_is_positive_and_consistent() -> None:
    nbytes = 8 << 20
    r = baselines.tcp_ceiling_gbps(nbytes, repeats=2)
    assert set(r) == {"bytes_per_s", "gbps", "seconds"}
    for v in r.values():
        assert math.isfinite(v) and v > 0
    assert r["seconds"] * r["bytes_per_s"] == pytest.approx(nbytes, rel=1e-9)
    assert r["gbps"] == pytest.approx(r["bytes_per_s"] * 8 / 1e9, rel=1e-12)


def test_tcp_ceiling_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        baselines.tcp_ceiling_gbps(0)
    with pytest.raises(ValueError):
        baselines.tcp_ceiling_gbps(1 << 20, repeats=0)
    with pytest.raises(ValueError):
        baselines.tcp_ceiling_gbps(1 << 20, chunk=0)


def test_ps_arithmetic_times_the_steps_work_over_every_chunk() -> None:
    # A last chunk shorter than the others (10 KiB = 2.5 chunks of 4 KiB): its own check
    # of the result (every worker's copy holds the updated value) passed, and took CPU.
    cpu_s = baselines.ps_arithmetic_cpu_s(10 << 10, 4 << 10, workers=3, repeats=1)
    assert math.isfinite(cpu_s) and cpu_s >= 0


@pytest.mark.parametrize(
    ("total", "chunk", "workers"), [(0, 4, 2), (10, 4, 2), (16, 6, 2), (16, 4, 0)]
)
def test_ps_arithmetic_refuses_sizes_that_are_not_float32(
    total: int, chunk: int, workers: int
) -> None:
    with pytest.raises(ValueError, match="float32"):
        baselines.ps_arithmetic_cpu_s(total, chunk, workers=workers)


@pytest.mark.slow  # (7 s; the end-to-end check of a wrong result runs gloo by default)
@pytest.mark.timeout(120)
def test_gloo_allreduce_small_returns_positive_times() -> None:
    r = baselines.gloo_allreduce_s([1000, 5000], repeats=2, verify=True)
    assert r["steps"] == 2
    assert math.isfinite(r["median_s"]) and r["median_s"] > 0
    assert 0 < r["min_s"] <= r["median_s"]


def test_check_allreduced_accepts_right_and_rejects_wrong_sums() -> None:
    expected = 3.0  # 2 ranks contributing 1 and 2
    good = [torch.full((10,), expected), torch.full((7,), expected)]
    gloo._check_allreduced(good, expected)
    bad = [torch.full((10,), expected), torch.full((7,), expected)]
    bad[1][4] = 2.0  # e.g. one rank's contribution lost
    with pytest.raises(ValueError, match=r"tensor 1 .*element 4 is 2.0, expected 3.0"):
        gloo._check_allreduced(bad, expected)


@pytest.mark.timeout(120)
def test_gloo_allreduce_wrong_result_is_caught_end_to_end() -> None:
    # Rank 0 corrupts its reduced tensor before verification: the call must raise,
    # not hang on the rank still waiting in the next collective.
    with pytest.raises(RuntimeError, match="allreduce verification failed"):
        baselines.gloo_allreduce_s([1000, 5000], repeats=2, _inject_fault=True)


def test_gloo_allreduce_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        baselines.gloo_allreduce_s([])
    with pytest.raises(ValueError):
        baselines.gloo_allreduce_s([10, 0])
    with pytest.raises(ValueError):
        baselines.gloo_allreduce_s([10], repeats=0)
    with pytest.raises(ValueError):
        baselines.gloo_allreduce_s([10], world_size=1)


def test_lean_ps_cuts_each_tensor_into_chunks_in_order() -> None:
    chunks = leanps.chunks_of([8, 20, 4], 8)  # float32: 2, 5 and 1 elements; 2 a chunk
    assert chunks == [(0, 0, 2), (1, 0, 2), (1, 2, 2), (1, 4, 1), (2, 0, 1)]
    assert leanps.chunks_of([1 << 20], 1 << 30) == [(0, 0, 1 << 18)]


def test_lean_ps_window_holds_all_but_one_and_releases_the_first_layers_first() -> None:
    w = leanps._Window()
    assert w.admit(b"a", 9)
    assert not w.admit(b"a", 7) and not w.admit(b"a", 3) and not w.admit(b"a", 8)
    assert w.admit(b"b", 5)  # another peer has a window of its own
    assert [w.credit(b"a"), w.credit(b"a"), w.credit(b"a")] == [3, 7, 8]
    assert w.credit(b"a") is None  # nothing held: the window is free again
    assert w.admit(b"a", 1)


@pytest.mark.slow  # (the benchmark's baseline between processes: 7 to 14 s)
@pytest.mark.timeout(120)
def test_lean_ps_runs_the_step_between_processes_and_checks_its_result() -> None:
    # 2 servers x 2 workers on loopback; each worker checks that its parameters hold the
    # SGD result of every step (it exits 1 otherwise, and run_lean raises).
    r = leanps.run_lean([1 << 20, 3 << 18, 4096], 3, 256 << 10, warmup=1, timeout_s=90)
    assert r["steps"] == 3 and 0 < r["median_s"] <= r["p90_s"]


def test_lean_ps_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="steps"):
        leanps.run_lean([1 << 20], 0, 1 << 20)
    with pytest.raises(ValueError, match="sizes"):
        leanps.run_lean([], 3, 1 << 20)
