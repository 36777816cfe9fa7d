"""Horovod's and BytePS's module-level API over real processes: one ``trimtab run`` job
per worker count runs every call of horovod_api_worker.py (``import trimtab as hvd``), and
the results are compared with Horovod's documented ones for rank-dependent inputs
(rank r holds r + 1: Sum = n(n+1)/2, Average = (n+1)/2, integer Average its floor, Min 1,
Max n, Product n!). A BytePS-style job trains a linear model with ``push_pull`` of each
gradient and is checked against the same updates computed with numpy."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import processes_of
from trimtab.launch.job import DEADLINE_STATUS, Job, LaunchConfig

HERE = Path(__file__).parent
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64", "uint8", "int8")


def _run(workers: int, command: list[str], deadline_s: float = 80.0) -> tuple[list[str], str]:
    lines: list[str] = []
    config = dataclasses.replace(LaunchConfig(workers=workers, servers=1), deadline_s=deadline_s)
    status = Job(config, command, output=lambda src, line: lines.append(f"[{src}] {line}")).run()
    assert status == 0, "\n".join(lines[-(400 if status == DEADLINE_STATUS else 60) :])
    assert processes_of(config.job) == []
    return lines, config.job


def _results(out: Path, workers: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(workers)]


@pytest.fixture(scope="module", params=[2, 3], ids=["2workers", "3workers"])
def horovod_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    n: int = request.param
    out = tmp_path_factory.mktemp(f"hvd{n}")
    _run(n, [sys.executable, str(HERE / "horovod_api_worker.py"), str(out)])
    return n, _results(out, n)


def _expected(op: str, dtype: str, n: int) -> float:
    total = n * (n + 1) // 2
    if op == "Sum":
        return total
    if op == "Average":
        return total // n if dtype in INTS else (n + 1) / 2
    if op == "Min":
        return 1
    if op == "Max":
        return n
    return math.factorial(n)


@pytest.mark.timeout(200)
def test_every_op_on_every_dtype_gives_horovod_s_result(horovod_job: Any) -> None:
    n, results = horovod_job
    for got in results:
        for dtype in FLOATS + INTS:
            for op in ("Average", "Sum", "Min", "Max", "Product"):
                res = got["reduced"][f"{dtype}/{op}"]
                want = _expected(op, dtype, n)
                assert res["dtype"] == dtype, (dtype, op, res)  # sums of ints stay ints
                assert res["shape"] == [2, 3]
                assert res["values"] == [[want] * 3] * 2, (dtype, op, res["values"])
                assert res["input_kept"], (dtype, op)


@pytest.mark.timeout(200)
def test_basics_and_build_flags_are_truthful(horovod_job: Any) -> None:
    n, results = horovod_job
    for r, got in enumerate(results):
        assert (got["rank"], got["size"], got["local_rank"], got["local_size"]) == (r, n, r, n)
        assert (got["cross_rank"], got["cross_size"]) == (0, 1)
        assert got["is_initialized"]
        built = got["built"]
        assert not any(v for k, v in built.items() if k not in ("cuda_built", "rocm_built"))
        import torch

        assert built["cuda_built"] == (torch.version.cuda is not None)


@pytest.mark.timeout(200)
def test_average_flags_scaling_in_place_and_async(horovod_job: Any) -> None:
    n, results = horovod_job
    total = n * (n + 1) / 2
    squares = sum((r + 1) ** 2 for r in range(n))
    for r, got in enumerate(results):
        assert got["default_op"] == got["average_true"] == (n + 1) / 2
        assert got["average_false"] == total
        assert got["scalar"]["shape"] == []
        assert got["scaled"] == 3.0 * squares  # each rank's own prescale, then postscale
        assert got["scaled_int"] == [int(10 * total * 0.5)]
        assert got["inplace"] == {"values": [total, 2 * total], "same_object": True}
        a = got["async"]
        assert a["a"] == [total]  # named ones submitted in another order on odd ranks
        assert a["b"] == a["b_in_place"] == [10.0 * n]
        assert a["a_input_kept"] == [r + 1.0]
        assert a["polled_are_bools"] and a["poll_after"]
        assert got["after_mismatch"] == total


@pytest.mark.timeout(200)
def test_allgather_broadcast_and_objects(horovod_job: Any) -> None:
    n, results = horovod_job
    rows = [[r, r] for r in range(n) for _ in range(r + 1)]
    for r, got in enumerate(results):
        assert got["allgather"] == {
            "shape": [len(rows), 2],
            "values": rows,
            "dtype": "torch.int64",
        }
        assert got["allgather_bool"] == [r % 2 == 0 for r in range(n) for _ in range(r + 1)]
        assert got["allgather_bf16"] == [[r + 0.5] * 2 for r in range(n)]
        assert got["broadcast"] == [1.0] * 3
        assert got["broadcast_input_kept"] == [float(r)] * 3
        assert got["broadcast_"] == [1, 1]
        assert got["broadcast_async"] == [1.25]
        assert got["allgather_object"] == [{"rank": q, "s": "x" * q} for q in range(n)]
        assert got["broadcast_object"] == {"from": 1, "list": [0, 1]}
        c = got["compression"]
        assert (c["compressed"], c["back"]) == ("torch.float16", "torch.float32")
        assert c["none_same"]
        assert c["allreduce_fp16"] == [n * (n + 1) / 2]
        assert c["allreduce_fp16_dtype"] == "torch.float32"
    joined = {got["join"] for got in results}
    assert len(joined) == 1 and joined <= set(range(n))


@pytest.mark.timeout(200)
def test_mismatches_and_misuse_are_clear_errors_never_hangs(horovod_job: Any) -> None:
    n, results = horovod_job
    for r, got in enumerate(results):
        for case, says in (
            ("mismatch_shape", "shape=[1]"),
            ("mismatch_dtype", "torch.float64"),
            ("mismatch_op", "op=max"),
            ("mismatch_kind", "broadcast root=0"),
        ):
            err = got[case]
            assert err["type"] == "RemoteError" and err["code"] == "mismatch", (case, err)
            assert says in err["msg"] and "rank 0:" in err["msg"], (case, err)
        assert "collective 'op'" in got["mismatch_op"]["msg"]
        for case, says in (
            ("adasum", "use op=trimtab.Average or op=trimtab.Sum"),
            ("bool_allreduce", "torch.uint8"),
            ("process_set", "process_set=None"),
            ("bad_root", f"0..{n - 1}"),
            ("both_average_and_op", "not both"),
        ):
            assert got[case]["type"] == "ConfigError" and says in got[case]["msg"], (case, got)
        if r == 0:
            assert got["is_initialized_after_shutdown"] is False
            assert got["init_after_shutdown"] == {}  # joined again, under its rank
            assert got["rank_after_init"] == 0
        else:
            err = got["after_rank0_left"]
            assert err["type"] == "RemoteError" and err["code"] == "bad_state", err
            assert "left the job" in err["msg"]


# -- BytePS -------------------------------------------------------------------------------

STEPS, LR, DIM, BATCH = 5, 0.1, 4, 6


def _byteps_reference(workers: int) -> tuple[np.ndarray, np.ndarray]:
    """The same updates in numpy: each worker's mean-squared-error gradient on its own
    batch, averaged over the workers (push_pull's average), then SGD."""
    w = np.linspace(-0.5, 0.5, DIM).astype(np.float64)
    b = 0.0
    for step in range(STEPS):
        gw, gb = np.zeros(DIM), 0.0
        for r in range(workers):
            rng = np.random.default_rng(1000 * step + r)
            x = rng.standard_normal((BATCH, DIM))
            y = rng.standard_normal(BATCH)
            err = x @ w + b - y
            gw += 2 * x.T @ err / BATCH
            gb += 2 * err.mean()
        w = w - LR * gw / workers
        b = b - LR * gb / workers
    return w, np.array([b])


@pytest.mark.timeout(120)
def test_byteps_push_pull_training_matches_numpy(tmp_path: Path) -> None:
    workers = 2
    command = [
        sys.executable,
        str(HERE / "byteps_api_worker.py"),
        str(tmp_path),
        str(STEPS),
        str(LR),
    ]
    _run(workers, command)
    want_w, want_b = _byteps_reference(workers)
    for got in _results(tmp_path, workers):
        np.testing.assert_allclose(got["weight"], want_w, rtol=0, atol=1e-5)
        np.testing.assert_allclose(got["bias"], want_b, rtol=0, atol=1e-5)
        assert got["declared"] == [f"grad.{name}" for name in ("weight", "bias")]
        assert got["staleness"]["type"] == "ConfigError"
        assert "--mode ssp" in got["staleness"]["msg"]
        assert got["push_pull_sum"] == [float(workers * (workers + 1) / 2)]
        assert got["optimizer"] == "DistributedOptimizer"
