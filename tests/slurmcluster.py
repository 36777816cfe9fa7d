"""A real Slurm cluster on the test bed, as a pytest fixture: ``munged`` with a key of
its own, ``slurmctld`` and one ``slurmd`` per bed host, each node a network namespace
(its own address) and a UTS namespace (its own host name, which is how a slurmd knows
which node it is: Debian's Slurm is not built for several slurmd under one name).

Run as root with ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``
(no cgroups here) and a ``cgroup.conf`` saying ``CgroupPlugin=cgroup/v1`` (Slurm 22.05
has no "disabled"). Every file is in a directory of its own; every daemon is stopped at
the end, and then every process left in the bed's namespaces (ours by construction).
Skipped, with the reason, where Slurm or munge is not installed
(``apt-get install slurm-wlm munge``) or no bed can be made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.raycluster import kill_all_in
from trimtab.launch.testbed import Testbed, unavailable

__all__ = ["SlurmCluster", "slurm_cluster", "slurm_missing", "slurm_on"]

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")


@dataclasses.dataclass
class SlurmCluster:
    """The bed (host i: node ``node<i>``; host 0 also the controller), the directory of
    its files, and the environment its commands need (``SLURM_CONF``)."""

    bed: Testbed
    root: Path
    env: dict[str, str]

    def run(self, argv: list[str], timeout: float = 60.0, **kw: object) -> str:
        """``argv`` (a Slurm command) run on node 0; its stdout. Fails the test if it
        fails."""
        done = subprocess.run(
            self.on(0, argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"{argv}: {done.stderr[-2000:]}"
        return done.stdout

    def on(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` as run on node ``node``: in its network namespace, under its name."""
        return self.bed.hosts[node].argv(
            ["unshare", "--uts", "sh", "-c", f'hostname node{node} && exec "$@"', "-", *argv]
        )


def _config(root: Path, bed: Testbed) -> None:
    nodes = "\n".join(
        f"NodeName=node{h.index} NodeAddr={h.address} CPUs=4 State=UNKNOWN" for h in bed.hosts
    )
    (root / "slurm.conf").write_text(f"""\
ClusterName=trimtab
SlurmctldHost=node0({bed.hosts[0].address})
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
{nodes}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    (root / "state").mkdir()
    for h in bed.hosts:
        (root / "spool" / f"node{h.index}").mkdir(parents=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)


def slurm_missing() -> str | None:
    """Why no Slurm cluster can be made here, or None."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)}): apt-get install slurm-wlm munge"
    why = unavailable()
    return None if why is None else f"no multi-host test bed here: {why}"


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    why = slurm_missing()
    if why is not None:
        pytest.skip(why)
    with Testbed(2) as bed, slurm_on(bed) as cluster:
        yield cluster


@contextlib.contextmanager
def slurm_on(bed: Testbed) -> Iterator[SlurmCluster]:
    """A Slurm cluster with a node per host of ``bed``, stopped on leaving. Blocks until
    every node is idle (seconds). Raises AssertionError, with the logs, if not in 60 s."""
    root = Path(tempfile.mkdtemp(prefix="ttslurm-"))  # short: it holds sockets
    root.chmod(0o755)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cluster = SlurmCluster(bed, root, env)
    procs: list[subprocess.Popen[bytes]] = []

    def daemon(node: int, argv: list[str], log: str) -> None:
        with open(root / log, "wb") as out:
            argv = cluster.on(node, argv)
            procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    try:
        _config(root, bed)
        munged = [
            "munged", "--foreground", "--force", f"--key-file={root}/munge.key",
            f"--socket={root}/munge.sock", f"--pid-file={root}/munged.pid",
            f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed",
        ]  # fmt: skip
        daemon(0, munged, "munged.out")
        deadline = time.monotonic() + 30
        while not (root / "munge.sock").exists():
            assert time.monotonic() < deadline, _logs(root)
            time.sleep(0.1)
        daemon(0, ["slurmctld", "-D", "-i"], "slurmctld.out")
        for h in bed.hosts:
            daemon(h.index, ["slurmd", "-D"], f"slurmd{h.index}.out")
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(cluster.on(0, ["sinfo", "-h", "-o", "%T %D"]), env=env,
                                 capture_output=True, text=True, timeout=30).stdout  # fmt: skip
            if out.strip() == f"idle {len(bed.hosts)}":
                break
            assert time.monotonic() < deadline, f"sinfo: {out!r}\n{_logs(root)}"
            time.sleep(0.5)
        yield cluster
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        kill_all_in(bed)  # slurmstepd and what it ran: every process in the bed is ours
        shutil.rmtree(root, ignore_errors=True)


def _logs(root: Path) -> str:
    return "\n".join(
        f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
        for f in sorted(root.glob("*.log")) + sorted(root.glob("*.out"))
    )
