"""``trimtab run --backend ray`` on a real 2-node Ray cluster in the test bed (the head
node in one network namespace, a worker node in another): roles run on both nodes, the
job's parameters are one process's (so its accuracy is the local run's), a scale-out
starts a server through Ray, and a server actor killed under ``--replicas 1`` loses
nothing. The slow tier: a Ray cluster takes seconds to start and much memory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import Setup, max_difference, reference
from tests.raycluster import RayCluster, kill_all_in_host, ray_cluster  # noqa: F401 (a fixture)
from trimtab.launch.backends.ray import actor_name

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
JOB = re.compile(r"^\[trimtab\] job (\S+) on the Ray cluster")
PLACED = re.compile(r"^\[trimtab\] (coordinator|server \d+|worker \d+) runs on (\S+)$")


def _run(
    cluster: RayCluster, flags: list[str], command: list[str], env: dict[str, str]
) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """``trimtab run --backend ray`` started in the head node's host (the driver's node),
    its output collected in the list returned as it comes."""
    argv = [
        sys.executable, "-m", "trimtab", "run", "--backend", "ray",
        "--address", cluster.address, "--worker-cpus", "0.5",
        "--server-cpus", "0.5", "--chunk-bytes", "8192", "--deadline", "200", *flags,
        "--", *command,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cluster.bed.hosts[0].argv(argv),
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, lines, reader


def _job(lines: list[str]) -> str | None:
    """The job's id, as the launcher says it (``job ID on the Ray cluster...``)."""
    found = [m.group(1) for m in map(JOB.match, list(lines)) if m]
    return found[0] if found else None


def _placed(lines: list[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in map(PLACED.match, lines) if m}


@pytest.mark.timeout(400)
def test_roles_on_both_nodes_one_processes_result_and_a_server_added_through_ray(
    ray_cluster: RayCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    cluster = ray_cluster
    setup = Setup("sgd", (12, 12), hidden=192)
    command = [
        "env", "EQUIV_HIDDEN=192", "EQUIV_SCALE=7:3", sys.executable,
        str(HERE / "equiv_worker.py"), "sgd", "12,12", str(tmp_path),
    ]  # fmt: skip
    proc, lines, reader = _run(cluster, ["-w", "2", "-s", "2", "--max-servers", "3"], command, {})
    status = proc.wait(300)
    reader.join(10)
    assert status == 0, "\n".join(lines[-80:])
    job = _job(lines)
    assert job is not None
    placed = _placed(lines)
    head, node = (h.address for h in cluster.bed.hosts)
    assert placed["coordinator"] == head  # the driver's node
    assert set(placed.values()) == {head, node}, placed
    assert {placed["worker 0"], placed["worker 1"]} == {head, node}  # spread
    assert "server 2" in placed, "the scale-out started no server through Ray"
    assert any("the coordinator asks for another server" in line for line in lines)
    expected = reference(setup)
    for rank in range(setup.workers):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    assert processes_of(job) == []


@pytest.mark.timeout(400)
def test_a_server_actor_killed_under_replicas_loses_nothing(
    ray_cluster: RayCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Rank 0 stops after step 5 (OUT/kill0) until the test has killed server 0's
    actor through Ray (``ray.kill``): its process dies with it, the coordinator
    promotes the backups, and the parameters are still one process's."""
    cluster = ray_cluster
    command = [sys.executable, str(HERE / "replica_worker.py"), "sgd", "12,12", str(tmp_path), "5"]
    proc, lines, reader = _run(
        cluster, ["-w", "2", "-s", "2", "--replicas", "1"], command,
        {"TRIMTAB_DEAD_AFTER_S": "3"},
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (tmp_path / "kill0").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines[-80:])
        time.sleep(0.1)
    job = _job(lines)
    assert job is not None
    name = actor_name(job, "server 0")
    cluster.driver(f"ray.kill(ray.get_actor({name!r}))\n")
    (tmp_path / "killed0").write_text("server 0")
    status = proc.wait(240)
    reader.join(10)
    assert status == 0, "\n".join(lines[-80:])
    assert any("server 0 died" in line and "backups take over" in line for line in lines), (
        "\n".join(lines[-80:])
    )
    expected = reference(Setup("sgd", (12, 12)))
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    assert processes_of(job) == []


@pytest.mark.timeout(300)
def test_trimtab_ray_run_from_a_ray_driver_uses_its_connection(
    ray_cluster: RayCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``trimtab.ray.run`` in a process that called ``ray.init`` itself: the job runs on
    that connection (which it leaves open) and ends with one process's parameters."""
    cluster = ray_cluster
    command = [
        "env", "EQUIV_HIDDEN=192", sys.executable, str(HERE / "equiv_worker.py"), "sgd",
        "12,12", str(tmp_path),
    ]  # fmt: skip
    out = cluster.driver(
        "import trimtab.ray\n"
        f"status = trimtab.ray.run({command!r}, workers=2, servers=1, chunk_bytes=8192,\n"
        "    worker_cpus=0.5, server_cpus=0.5, deadline_s=200,\n"
        "    output=lambda src, line: print(f'[{src}] {line}', flush=True))\n"
        "assert ray.is_initialized(), 'the driver lost its connection'\n"
        "print('status', status)\n",
        timeout=240,
    )
    assert out.splitlines()[-1] == "status 0", out[-3000:]
    expected = reference(Setup("sgd", (12, 12), hidden=192))
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"


@pytest.mark.timeout(300)
def test_a_worker_actor_killed_without_elastic_workers_ends_the_job_with_a_message(
    ray_cluster: RayCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """No recovery applies to a lost worker of a job without ``--min-workers``: the job
    ends, saying which worker was lost and how, and leaves nothing running."""
    cluster = ray_cluster
    command = [sys.executable, str(HERE / "replica_worker.py"), "sgd", "12,12", str(tmp_path), "3"]
    proc, lines, reader = _run(cluster, ["-w", "2", "-s", "1"], command, {})
    deadline = time.monotonic() + 240
    while not (tmp_path / "kill0").exists():  # rank 0 waits after step 3
        assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines[-80:])
        time.sleep(0.1)
    job = _job(lines)
    assert job is not None
    cluster.driver(f"ray.kill(ray.get_actor({actor_name(job, 'worker 1')!r}))\n")
    status = proc.wait(120)
    reader.join(10)
    assert status != 0
    said = "worker 1 exited with status -9 (killed by SIGKILL); stopping the job"
    assert any(said in line for line in lines), "\n".join(lines[-40:])
    assert processes_of(job) == []


@pytest.mark.timeout(300)
def test_a_ray_node_lost_is_lost_members_and_the_job_recovers(
    ray_cluster: RayCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The worker node dies outright (every process of its host killed: its raylet, its
    actors, their roles). Each role it held is a lost member: the job, with replicas
    and elastic workers, goes on without them and ends well (or, had Ray put both
    servers there, ends saying what was lost). Runs last: the cluster has one node
    after it."""
    cluster = ray_cluster
    command = [sys.executable, str(HERE / "replica_worker.py"), "sgd", "12,12", str(tmp_path), "5"]
    flags = ["-w", "2", "-s", "2", "--replicas", "1", "--min-workers", "1"]
    proc, lines, reader = _run(cluster, flags, command, {"TRIMTAB_DEAD_AFTER_S": "3"})
    deadline = time.monotonic() + 240
    while not (tmp_path / "kill0").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines[-80:])
        time.sleep(0.1)
    node = cluster.bed.hosts[1]
    lost = {role for role, where in _placed(lines).items() if where == node.address}
    assert lost and "coordinator" not in lost, _placed(lines)
    kill_all_in_host(node.namespace)
    (tmp_path / "killed0").write_text("node 1")
    status = proc.wait(240)
    reader.join(10)
    said = "\n".join(lines)
    # The coordinator saw each lost member go (the launcher may not hear it from Ray
    # before the job ends: Ray takes its time to declare a dead node's actors dead).
    servers = sum(r.startswith("server") for r in lost)
    workers = [int(r.split()[1]) for r in lost if r.startswith("worker")]
    assert said.count("chunks go to their backups") >= servers, said[-6000:]
    for rank in workers:
        assert f"worker {rank} lost" in said, said[-6000:]
    if servers < 2:  # a backup of every chunk survived
        assert status == 0, said[-6000:]
    else:  # Ray put both servers on the node: nothing can recover that; said so, ended
        assert status != 0 and "lost" in said, said[-6000:]
    assert processes_of(_job(lines) or "?") == []
