"""Roles started from environment variables alone, one per bed host, in shuffled order
(the coordinator last): what a scheduler does with ``trimtab start``. The job's
parameters are the one-process run's (BSP), so its accuracy is the local run's.

The second test emulates a Kubernetes JobSet (docs/k8s/jobset.yaml, whose variables
it reads): roles find each other by stable host names (each host's /etc/hosts, as
``ip netns exec`` mounts /etc/netns/NS/hosts), workers take their rank from
``JOB_COMPLETION_INDEX``, and the secret is a mounted file. No cluster runs here: only
the manifest's contract is tested.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import Setup, max_difference, reference
from tests.testbed import testbed_factory  # noqa: F401 (a fixture)
from trimtab.launch.testbed import Host, Testbed
from trimtab.transport.auth import make_secret_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("equiv_worker.py")
PORT = 9555


def _start(host: Host, env: dict[str, str], out: Path, setup: Setup) -> subprocess.Popen[bytes]:
    """``trimtab start`` on ``host`` with ``env`` as its whole environment."""
    worker = [sys.executable, str(SCRIPT), setup.optimizer, ",".join(map(str, setup.batch_sizes))]
    argv = host.argv([sys.executable, "-m", "trimtab", "start", "--", *worker, str(out)])
    log = open(out / f"{env['NAME']}.log", "wb")  # noqa: SIM115 - closed by the process
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _run_job(bed: Testbed, tmp: Path, coordinator: str, roles: list[tuple[int, dict[str, str]]],
             setup: Setup, job: str, servers: int = 1) -> None:  # fmt: skip
    """Start ``roles`` ((bed host, their own variables)) in that order, 0.3 s apart,
    with the job's common variables; wait for every one to exit 0; check the result."""
    secret = make_secret_file(tmp)
    common = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT / "src")),
        "TRIMTAB_COORDINATOR": coordinator,
        "TRIMTAB_NUM_WORKERS": str(setup.workers),
        "TRIMTAB_NUM_SERVERS": str(servers),
        "TRIMTAB_JOB": job,
        "TRIMTAB_SECRET_FILE": str(secret),
        "TRIMTAB_CHUNK_BYTES": "8192",
        "EQUIV_HIDDEN": str(setup.hidden),
        "OMP_NUM_THREADS": "1",
    }
    out = tmp / "out"
    out.mkdir()
    procs = []
    try:
        for index, own in roles:
            procs.append((own["NAME"], _start(bed.hosts[index], {**common, **own}, out, setup)))
            time.sleep(0.3)
        deadline = time.monotonic() + 150
        while any(p.poll() is None for _, p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        logs = {n: (out / f"{n}.log").read_text(errors="replace")[-3000:] for n, _ in procs}
        for name, p in procs:
            assert p.poll() == 0, f"{name} exited with {p.poll()}:\n{logs[name]}"
    finally:
        for _, p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    expected = reference(setup)
    for rank in range(setup.workers):
        got = torch.load(out / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    assert processes_of(job) == []


@pytest.mark.timeout(200)
def test_roles_from_the_environment_alone_in_shuffled_order_match_one_process(
    testbed_factory, tmp_path: Path  # noqa: F811
) -> None:  # fmt: skip
    """Host 0 the coordinator, host 1 the server, hosts 2 and 3 a worker each; started
    worker 1, server, worker 0, coordinator: each waits for those it needs."""
    bed = testbed_factory(4)
    coordinator = f"tcp://{bed.hosts[0].address}:{PORT}"
    roles = [
        (3, {"NAME": "worker1", "TRIMTAB_ROLE": "worker", "TRIMTAB_RANK": "1"}),
        (1, {"NAME": "server", "DMLC_ROLE": "server"}),
        (2, {"NAME": "worker0", "TRIMTAB_ROLE": "worker", "DMLC_WORKER_ID": "0"}),
        (0, {"NAME": "coordinator", "TRIMTAB_ROLE": "coordinator"}),
    ]
    _run_job(bed, tmp_path, coordinator, roles, Setup("sgd", (12, 12), hidden=192), "envjob1")


def _manifest_env(job: str) -> dict[str, str]:
    """The variables the manifest gives the pods of replicated job ``job``."""
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((ROOT / "docs" / "k8s" / "jobset.yaml").read_text())
    [replicated] = [r for r in spec["spec"]["replicatedJobs"] if r["name"] == job]
    [container] = replicated["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:3] == ["trimtab", "start", "--"]
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.timeout(200)
def test_a_jobset_s_contract_host_names_and_completion_index(
    testbed_factory, tmp_path: Path  # noqa: F811
) -> None:  # fmt: skip
    """The JobSet of docs/k8s/jobset.yaml, each pod given that manifest's variables
    (its job's shape scaled down to 2 servers and 2 workers, and the secret's path
    here): pods reach the coordinator as ``trimtab-coordinator-0-0.trimtab`` (the
    JobSet's headless service), bind their own name's address, and a worker's rank is
    its ``JOB_COMPLETION_INDEX``."""
    bed = testbed_factory(5)
    names = {
        0: "trimtab-coordinator-0-0.trimtab",
        1: "trimtab-server-0-0.trimtab",
        2: "trimtab-server-0-1.trimtab",
        3: "trimtab-worker-0-0.trimtab",
        4: "trimtab-worker-0-1.trimtab",
    }
    hosts = "".join(f"{bed.hosts[i].address} {n}\n" for i, n in names.items())
    scaled = {"TRIMTAB_NUM_SERVERS": "2", "TRIMTAB_NUM_WORKERS": "2", "TRIMTAB_JOB": "envjob2"}
    made = []
    try:
        for h in bed.hosts:  # every pod resolves every other by name (cluster DNS)
            where = Path("/etc/netns") / h.namespace
            where.mkdir(parents=True)
            made.append(where)
            (where / "hosts").write_text(f"127.0.0.1 localhost\n{hosts}")
        pods = [(3, "worker", 0), (0, "coordinator", 0), (4, "worker", 1), (2, "server", 1),
                (1, "server", 0)]  # fmt: skip
        roles = []
        for host, job, index in pods:
            env = {k: v for k, v in _manifest_env(job).items() if k != "TRIMTAB_SECRET_FILE"}
            env.update(scaled, NAME=f"{job}{index}", JOB_COMPLETION_INDEX=str(index))
            roles.append((host, env))
        coordinator = roles[1][1]["TRIMTAB_COORDINATOR"]
        assert coordinator == f"tcp://{names[0]}:29555"
        _run_job(bed, tmp_path, coordinator, roles, Setup("adam", (5, 19), hidden=192),
                 "envjob2", servers=2)  # fmt: skip
    finally:
        for where in made:
            shutil.rmtree(where, ignore_errors=True)
