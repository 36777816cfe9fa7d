"""Sparse gradients over real processes and TCP: a Horovod-style script with
``nn.EmbeddingBag(sparse=True)`` and a dense MLP, 2 servers x 2 workers, gives one
process's parameters for SGD, Adagrad and SparseAdam; the same with the table on the
servers (``trimtab.nn.EmbeddingBag``); while the row blocks migrate live, and when a
server dies under ``--replicas 1``."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.sparse_job import OPTIMIZERS, max_difference, reference
from trimtab.launch.job import Job, LaunchConfig

SCRIPT = Path(__file__).with_name("sparse_worker.py")


def _run(
    config: LaunchConfig, out: Path, names: tuple[str, ...], kills: dict[int, str] | None = None
) -> list[str]:
    """Run sparse_worker.py's job to its end; after each step of ``kills`` (step: the
    process, e.g. "server 1"), when rank 0 asks, SIGKILL that process. Fails the test if
    the job fails. Returns its output."""
    lines: list[str] = []
    kills = kills or {}
    config = dataclasses.replace(config, deadline_s=100.0)
    command = [sys.executable, str(SCRIPT), str(out), ",".join(map(str, kills)), *names]
    job = Job(
        config,
        command,
        output=lambda src, line: lines.append(f"[{src}] {line}"),
        extra_env={"TRIMTAB_DEAD_AFTER_S": "3"} if kills else None,
    )
    status: list[int] = []
    runner = threading.Thread(target=lambda: status.append(job.run()), daemon=True)
    runner.start()
    for n, victim in enumerate(kills.values()):
        deadline = time.monotonic() + 60
        while not (out / f"kill{n}").exists() and runner.is_alive():
            assert time.monotonic() < deadline, "\n".join(lines[-60:])
            time.sleep(0.02)
        procs = [p for p in job._procs if p.source == victim]
        assert procs, f"no {victim} among {[p.source for p in job._procs]}"
        procs[0].handle.signal(signal.SIGKILL)
        procs[0].handle.wait()
        (out / f"killed{n}").write_text(victim)
    runner.join(110)
    assert status == [0], "\n".join(lines[-60:])
    assert processes_of(config.job) == []
    return lines


def _check(out: Path, cases: tuple[str, ...]) -> None:
    for case in cases:
        name, _, kind = case.partition(":")
        expected = reference(name, server=kind in ("server", "hot"))
        for rank in (0, 1):
            got = torch.load(out / case.replace(":", "-") / f"rank{rank}.pt")
            assert max_difference(got, expected) < 1e-5, f"{case}: rank {rank} diverged"


#: torch's sparse EmbeddingBag on every worker, and trimtab.nn's (on the servers).
CASES = (*OPTIMIZERS, *(f"{name}:server" for name in OPTIMIZERS), "adagrad:hot")


@pytest.mark.timeout(120)
def test_sparse_gradients_over_tcp_match_one_process_while_row_blocks_migrate(
    tmp_path: Path,
) -> None:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=256, rebalance_every=3)
    _run(config, tmp_path, CASES)
    _check(tmp_path, CASES)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["job"]["migrations"] > 0  # row blocks moved under the training
    # Row requests went in batches, one per server (protocol/batch.py), many chunks each.
    batches = sum(s["batches"] for s in stats["servers"])
    assert batches > 0 and sum(s["batch_parts"] for s in stats["servers"]) > 2 * batches


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_server_killed_under_replicas_loses_no_row(tmp_path: Path) -> None:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=256, replicas=1)
    cases = ("adagrad:hot", "sparseadam")
    lines = _run(config, tmp_path, cases, kills={4: "server 1"})
    _check(tmp_path, cases)
    assert any("its backups take over" in line for line in lines)
