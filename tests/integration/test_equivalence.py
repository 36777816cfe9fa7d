"""Invariant 1 over real processes and TCP: N workers x S servers under BSP give the
parameters of one process running the same optimizer over the same global batches."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import Setup, max_difference, reference
from trimtab.cli.roles import SERVER_KEY
from trimtab.launch.job import DEADLINE_STATUS, Job, LaunchConfig
from trimtab.transport.shm import SHM_DIR, job_prefix

SCRIPT = Path(__file__).with_name("equiv_worker.py")


def _run(
    config: LaunchConfig,
    command: list[str],
    env: dict[str, str] | None = None,
    deadline_s: float = 90.0,
) -> list[str]:
    """Run a job to its end; return its output lines. Fails the test if the job fails,
    with the end of its output, or, if it ran past ``deadline_s`` (before the test's own
    timeout), with every process's stacks."""
    lines: list[str] = []
    config = dataclasses.replace(config, deadline_s=deadline_s)
    job = Job(
        config, command, output=lambda src, line: lines.append(f"[{src}] {line}"), extra_env=env
    )
    status = job.run()
    assert status == 0, "\n".join(lines[-(400 if status == DEADLINE_STATUS else 40) :])
    return lines


def _train(
    config: LaunchConfig,
    optimizer: str,
    sizes: tuple[int, ...],
    out: Path,
    env: dict[str, str] | None = None,
) -> None:
    """Run the equivalence job's workers under ``config``; each saves its parameters."""
    command = [sys.executable, str(SCRIPT), optimizer, ",".join(map(str, sizes)), str(out)]
    _run(config, command, env)


@dataclasses.dataclass(frozen=True)
class Case:
    """A BSP case run by equiv_worker.py ``--cases``: the optimizer, each worker's batch
    size (unequal sizes sum to the global batch), and what its job is."""

    optimizer: str
    sizes: tuple[int, ...]
    servers: int = 2
    rebalance_every: int = 0  # forced migrations of every chunk every N steps (0: none)
    overlap: bool = False  # DistributedOptimizer(model=...): the forward waits per module

    @property
    def shape(self) -> tuple[int, int, int]:
        """What its job is (workers, servers, migrations): the cases of one shape share
        a job."""
        return len(self.sizes), self.servers, self.rebalance_every

    @property
    def argument(self) -> str:
        sizes = ",".join(map(str, self.sizes))
        return f"{self.optimizer}:{sizes}{':overlap' if self.overlap else ''}"

    @property
    def directory(self) -> str:  # where equiv_worker.py writes the case's files
        return self.argument.replace(":", "-").replace(",", "x")


#: Over TCP, one case of each optimizer mode; the whole matrix of sizes, servers and
#: optimizers runs on the in-process cluster (tests/unit/test_roles_inproc.py), where
#: the same roles run without the processes' start (4 s a job on 2 cores).
BSP_CASES = [
    Case("sgd", (10, 3, 11)),
    Case("adam", (17, 7), servers=1),
    Case("rmsprop-sum", (9, 15)),
]
#: step() only sends, each module's forward waits for its own parameters.
OVERLAP_CASES = [
    Case("sgd", (5, 19), overlap=True),
    Case("adam", (4, 9, 11), rebalance_every=3, overlap=True),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Case], tuple[Path, str]]:
    """Runs BSP_CASES and OVERLAP_CASES, one job per shape (a process costs more than its
    20 steps): the first test of a shape runs every case of it, one after the other, and
    each test reads its own case's files. Returns, for a case, the directory of its
    files and the id of its job (whose stats.json, beside that directory, is the whole
    job's)."""
    root = tmp_path_factory.mktemp("equiv")
    jobs: dict[tuple[int, int, int], tuple[Path, str]] = {}

    def run(case: Case) -> tuple[Path, str]:
        if case.shape not in jobs:
            workers, servers, every = case.shape
            config = LaunchConfig(
                workers=workers, servers=servers, chunk_bytes=512, rebalance_every=every
            )
            out = root / "{}w{}s-migrate{}".format(*case.shape)
            out.mkdir()
            together = [c.argument for c in BSP_CASES + OVERLAP_CASES if c.shape == case.shape]
            _run(config, [sys.executable, str(SCRIPT), "--cases", str(out), *together])
            jobs[case.shape] = out, config.job
        out, job = jobs[case.shape]
        return out / case.directory, job

    return run


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case",
    BSP_CASES,
    ids=[
        f"{c.optimizer}-{len(c.sizes)}w{c.servers}s-{'x'.join(map(str, c.sizes))}"
        for c in BSP_CASES
    ],
)
def test_bsp_over_tcp_matches_one_process(
    trained: Callable[[Case], tuple[Path, str]], case: Case
) -> None:
    out, job = trained(case)
    expected = reference(Setup(case.optimizer, case.sizes))
    for rank in range(len(case.sizes)):
        got = torch.load(out / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    assert processes_of(job) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case",
    # (the 3-worker Adam case with migrations is a job of its own, 20 s: the slow tier)
    [pytest.param(c, marks=pytest.mark.slow if c.rebalance_every else ()) for c in OVERLAP_CASES],
    ids=[f"{c.optimizer}-{len(c.sizes)}w-migrate{c.rebalance_every}" for c in OVERLAP_CASES],
)
def test_forward_waiting_per_module_matches_one_process(
    trained: Callable[[Case], tuple[Path, str]], case: Case
) -> None:
    """``DistributedOptimizer(model=...)``: step() only sends, each module's forward
    waits for its own parameters (answers that may have to follow a migrated chunk),
    the final ``state_dict()`` waits for the rest: still the one-process parameters."""
    out, job = trained(case)
    expected = reference(Setup(case.optimizer, case.sizes))
    for rank in range(len(case.sizes)):
        got = torch.load(out / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    if case.rebalance_every:
        stats = json.loads((out.parent / "stats.json").read_text())
        assert stats["job"]["migrations"] > 0  # chunks moved under the waiting forwards
    assert processes_of(job) == []


COMPRESSION_CASES = [("sgd", (5, 19), "fp16"), ("adam", (12, 12), "bf16")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("optimizer", "sizes", "compression"),
    # (bf16 in the slow tier: fp16 runs the same path in the default run)
    [pytest.param(*c, marks=pytest.mark.slow if c[2] == "bf16" else ()) for c in COMPRESSION_CASES],
    ids=[f"{o}-{c}" for o, _, c in COMPRESSION_CASES],
)
def test_compressed_pushes_match_one_process_with_rounded_gradients(
    tmp_path: Path, optimizer: str, sizes: tuple[int, ...], compression: str
) -> None:
    """With ``--compression``, each worker's gradient is rounded to fp16 / bf16 on the
    wire: the parameters match one process whose per-slice gradients are rounded the
    same way (to 1e-5), and not the uncompressed run (which differs by more)."""
    config = LaunchConfig(workers=len(sizes), servers=2, chunk_bytes=512, compression=compression)
    _train(config, optimizer, sizes, tmp_path)
    wire = torch.float16 if compression == "fp16" else torch.bfloat16
    rounded = reference(Setup(optimizer, sizes), wire)
    exact = reference(Setup(optimizer, sizes))
    for rank in range(len(sizes)):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, rounded) < 1e-5, f"rank {rank} diverged"
        assert max_difference(got, exact) > 2e-5, "the gradients were not compressed"


@pytest.mark.timeout(120)
def test_lbbsp_over_tcp_changes_sizes_and_matches_one_process(tmp_path: Path) -> None:
    """LB-BSP picks every step's split from measured speeds (worker 2 emulated 4x
    slower); the parameters still match one process over the same global batches."""
    config = LaunchConfig(
        workers=3,
        servers=2,
        chunk_bytes=512,
        batching="lbbsp",
        stragglers=("worker:2:slowdown=4@0-",),
    )
    command = [sys.executable, str(SCRIPT), "adam", "8,8,8", str(tmp_path)]
    _run(config, command)
    expected = reference(Setup("adam", (8, 8, 8)))
    sizes = torch.load(tmp_path / "sizes0.pt")
    for rank in range(3):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
        assert torch.load(tmp_path / f"sizes{rank}.pt") == sizes
    assert all(sum(s) == 24 for s in sizes)
    assert len(set(sizes)) >= 3, sizes
    assert sizes[-1][2] < 8, sizes  # the straggler ends with less than an equal share


SHARED_CASES = [
    # (optimizer, shared memory on, local lane on, forced migration every N steps (0: none),
    # TRIMTAB_SPIN_US: how long every wait polls before it sleeps)
    ("adam", True, True, 3, 50),
    ("sgd", True, True, 0, 0),
    ("sgd", True, False, 3, 50),  # shared memory with ZeroMQ for the messages
    ("sgd", False, False, 0, 0),  # every byte through TCP
]


def _shared_case_id(optimizer: str, shared: bool, lane: bool, every: int, spin: int) -> str:
    path = ("shm" if lane else "shm-zeromq") if shared else "sockets"
    return f"{optimizer}-{path}{f'-moves{every}' if every else ''}{'-polling' if spin else ''}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("optimizer", "shared", "lane", "every", "spin"),
    # (the lane's two cases in the slow tier: the BSP jobs above run the lane with shared
    # memory by default; ZeroMQ with shared memory and every byte over TCP stay here)
    [pytest.param(*c, marks=pytest.mark.slow if c[2] else ()) for c in SHARED_CASES],
    ids=[_shared_case_id(*case) for case in SHARED_CASES],
)
def test_big_chunks_through_shared_memory_or_sockets_match_one_process(
    tmp_path: Path, optimizer: str, shared: bool, lane: bool, every: int, spin: int
) -> None:
    """Chunks too big to ride inside a header (a hidden layer of 192: weights of 7.5 and
    12 KiB, cut at 8 KiB): between processes of one machine their gradients and values go
    through each worker's shared memory (with pushes resent to a chunk's new owner after
    a migration), their messages over the local lane or, with TRIMTAB_LANE=0, ZeroMQ;
    with TRIMTAB_SHM=0 everything goes through TCP; workers and servers poll before they
    sleep (TRIMTAB_SPIN_US) or not. All give one process's parameters, and no arena is
    left in /dev/shm."""
    sizes = (5, 19)
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=8192, rebalance_every=every)
    command = [sys.executable, str(SCRIPT), optimizer, ",".join(map(str, sizes)), str(tmp_path)]
    env = {"EQUIV_HIDDEN": "192", "TRIMTAB_SHM": "1" if shared else "0"}
    env["TRIMTAB_LANE"] = "1" if lane else "0"
    env["TRIMTAB_SPIN_US"] = str(spin)
    _run(config, command, env)
    setup = Setup(optimizer, sizes, hidden=192)
    expected = reference(setup)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    stats = json.loads((tmp_path / "stats.json").read_text())
    job, servers_stats = stats["job"], stats["servers"]
    pushes = sum(s["pushes"] for s in servers_stats)
    assert pushes == len(job["owners"]) * 2 * setup.steps  # each applied exactly once
    # Over 4 KiB: the 10x192 weight (7.5 KiB) and both 6 KiB halves of the 192x16 one.
    big = 3
    shared_pushes = sum(s["shared"] for s in servers_stats)
    assert shared_pushes == (big * 2 * setup.steps if shared else 0)
    assert sum(s["lane"] for s in servers_stats) == (pushes if lane else 0)
    if every:
        # A migration is started at a step boundary only when the one before it is done;
        # under load one can take 4 steps (its chunks are handed over once their last
        # round before the cut is answered), and the boundaries after it then slip.
        assert job["migrations"] >= setup.steps // every // 2, job
    assert list(SHM_DIR.glob(job_prefix(config.job) + "*")) == []


MIGRATION_CASES = [
    ("sgd", (5, 19), 2),
    ("adam", (2, 20, 2), 3),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(  # (the second, 3 x 3 with Adam, 12 to 18 s: in the slow tier)
    ("optimizer", "sizes", "servers"),
    [
        pytest.param(o, b, s, id=f"{o}-{len(b)}w{s}s", marks=pytest.mark.slow if n else ())
        for n, (o, b, s) in enumerate(MIGRATION_CASES)
    ],
)
def test_bsp_with_live_migrations_matches_one_process(
    tmp_path: Path, optimizer: str, sizes: tuple[int, ...], servers: int
) -> None:
    """Every 3 steps every chunk moves to the next server (value, optimizer state and
    version handed over live); the parameters still match one process, and every
    pushed gradient was applied exactly once."""
    config = LaunchConfig(workers=len(sizes), servers=servers, chunk_bytes=512, rebalance_every=3)
    command = [sys.executable, str(SCRIPT), optimizer, ",".join(map(str, sizes)), str(tmp_path)]
    _run(config, command)
    setup = Setup(optimizer, sizes)
    expected = reference(setup)
    for rank in range(len(sizes)):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    stats = json.loads((tmp_path / "stats.json").read_text())
    job, servers_stats = stats["job"], stats["servers"]
    chunks = len(job["owners"])
    assert job["migrations"] >= setup.steps // 3 // 2, job  # (see the shared-memory test)
    # Every chunk moved at least once, and ended where the last map says.
    assert sum(s["moved_in"] for s in servers_stats) >= chunks
    versions = {int(c): v for s in servers_stats for c, v in s["versions"].items()}
    assert sorted(versions) == list(range(chunks))  # each chunk owned by exactly one server
    for s in servers_stats:
        for c in s["versions"]:
            assert job["owners"][int(c)] == s["index"]
    # Exactly once: one update per step per chunk, one push per worker per step per chunk.
    assert set(versions.values()) == {setup.steps}
    assert sum(s["pushes"] for s in servers_stats) == chunks * len(sizes) * setup.steps
    assert processes_of(config.job) == []


@pytest.mark.timeout(180)
def test_bsp_with_servers_added_and_one_removed_matches_one_process(tmp_path: Path) -> None:
    """Forced migrations at every step boundary (so workers often push by a map a few
    epochs old, and a chunk moves back to a server it left); after step 5 the job grows
    to 3 servers (the launcher starts one, chunks move onto it), after step 10 it shrinks
    to 2 (one drains and exits), after step 15 it grows to 3 again (``max_servers``
    counts live servers, so a fourth process starts). Same parameters as one process;
    each gradient applied once."""
    config = LaunchConfig(workers=2, servers=2, max_servers=3, chunk_bytes=512, rebalance_every=1)
    command = [sys.executable, str(SCRIPT), "adam", "7,17", str(tmp_path)]
    # The server key lets the servers the launcher adds join the running job.
    env = {"EQUIV_SCALE": "5:3,10:2,15:3", SERVER_KEY: "ab" * 32}
    lines = _run(config, command, env, deadline_s=150.0)
    setup = Setup("adam", (7, 17))
    expected = reference(setup)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    stats = json.loads((tmp_path / "stats.json").read_text())
    job_status, servers_stats = stats["job"], stats["servers"]
    assert len(job_status["servers"]) == 4  # two joined
    assert len(job_status["active_servers"]) == 3  # one left
    left = (set(range(4)) - set(job_status["active_servers"])).pop()
    assert left not in job_status["owners"]
    assert any("starting server 2" in line for line in lines)
    assert any("starting server 3" in line for line in lines)
    live = [s for s in servers_stats if s["index"] != left]
    chunks = len(job_status["owners"])
    versions = {int(c): v for s in live for c, v in s["versions"].items()}
    assert sorted(versions) == list(range(chunks)) and set(versions.values()) == {setup.steps}
    assert sum(s["pushes"] for s in live) == chunks * 2 * setup.steps
    assert processes_of(config.job) == []
