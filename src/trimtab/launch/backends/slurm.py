"""The Slurm backend: each role a job step (``srun``) on a node of the allocation the
launcher runs in, placed by :mod:`trimtab.launch.hosts`' rule over its nodes (the
coordinator on the first; server ``i`` on node ``i mod N``; worker ``r`` on node
``(S + r) mod N``), bound on the node's address (its ``NodeAddr``).

``trimtab run --backend slurm`` outside an allocation asks for one first
(:func:`submit`: ``salloc``, which runs the launcher once the nodes are granted and
streams its output), so one command submits the job and waits for it. Inside one (an
``sbatch`` script, an ``salloc`` shell) it uses the allocation it is given.

A step that Slurm ends (a node lost, the allocation's time up) reads as the role's
exit status: a lost member like any other. The job's secret is made in the working
directory, which a cluster's nodes share, never in a variable's value.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from trimtab.errors import ConfigError
from trimtab.launch.backends.base import Backend, RoleHandle, RoleSpec
from trimtab.launch.backends.local import LocalRole, popen_role

__all__ = ["SlurmBackend", "in_allocation", "submit"]

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is that of a process inside a Slurm allocation."""
    return bool(environ.get(JOB_ID) and environ.get(NODELIST))


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"--backend slurm needs Slurm's `{name}` on PATH (is Slurm installed?)")
    return found


def _scontrol(*args: str) -> str:
    done = subprocess.run(
        [_tool("scontrol"), *args], capture_output=True, text=True, check=False, timeout=30
    )
    if done.returncode != 0:
        raise ConfigError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def submit(argv: Sequence[str], nodes: int, tasks: int) -> int:
    """Run ``argv`` (the launcher, ``--backend slurm``) in a new allocation of ``nodes``
    nodes and ``tasks`` tasks (``salloc``), streaming its output. Blocks until the job
    is over; returns its status. Raises :class:`ConfigError` without Slurm."""
    salloc = [
        _tool("salloc"), f"--nodes={nodes}", f"--ntasks={tasks}", "--job-name=trimtab",
        "--quiet", *argv,
    ]  # fmt: skip
    return subprocess.call(salloc)


class SlurmBackend(Backend):
    """Roles as job steps on the nodes of the allocation this process runs in."""

    name = "slurm"

    def __init__(self, servers: int, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        if not in_allocation(self._environ):
            raise ConfigError(
                "--backend slurm runs inside an allocation (sbatch, salloc): none here "
                f"({JOB_ID} is not set); `trimtab run --backend slurm` outside one asks "
                "for one itself"
            )
        self.servers = servers
        self.nodes: list[str] = []
        self.addresses: dict[str, str] = {}

    def up(self) -> None:
        self.nodes = _scontrol("show", "hostnames", self._environ[NODELIST]).split()
        for node in self.nodes:
            found = re.search(r"NodeAddr=(\S+)", _scontrol("show", "node", "-o", node))
            self.addresses[node] = found.group(1) if found else node

    def down(self) -> None:
        """Cancel any step of this job's roles still known to Slurm (one whose
        ``srun`` was killed outright leaves its tasks to Slurm). Never raises."""
        squeue, scancel = shutil.which("squeue"), shutil.which("scancel")
        if squeue is None or scancel is None:
            return
        job = self._environ[JOB_ID]
        try:
            steps = subprocess.run(
                [squeue, "-h", "-s", "-j", job, "-o", "%i %j"],
                capture_output=True, text=True, check=False, timeout=30,
            ).stdout.split("\n")  # fmt: skip
            for line in steps:
                step, _, name = line.partition(" ")
                if name.startswith("trimtab-"):
                    subprocess.run([scancel, step], check=False, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass

    def where(self) -> str | None:
        nodes = ", ".join(f"{n} {self.addresses[n]}" for n in self.nodes)
        return f"in Slurm job {self._environ[JOB_ID]}, on nodes {nodes}"

    def node_of(self, role: RoleSpec) -> str:
        """The node ``role`` runs on (see the module's rule)."""
        n = len(self.nodes)
        if role.kind == "coordinator":
            return self.nodes[0]
        if role.kind == "server":
            return self.nodes[role.index % n]
        return self.nodes[(self.servers + role.index) % n]

    def start(self, role: RoleSpec) -> RoleHandle:
        node = self.node_of(role)
        srun = [
            _tool("srun"), "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            "--export=ALL", "--kill-on-bad-exit=0", "--quiet",
            f"--job-name=trimtab-{role.source.replace(' ', '-')}",
        ]  # fmt: skip
        handle = popen_role([*srun, *role.with_host(self.addresses[node])], dict(role.env))
        return LocalRole(handle.popen, node=self.addresses[node])

    def secret_parent(self) -> str | None:
        return os.getcwd()  # a cluster's nodes share it (/tmp they do not)

    def local(self, rank: int, workers: int) -> tuple[int, int, int, int]:
        n = len(self.nodes)
        node = (self.servers + rank) % n
        peers = [r for r in range(workers) if (self.servers + r) % n == node]
        hosts = list(dict.fromkeys((self.servers + r) % n for r in range(workers)))
        return peers.index(rank), len(peers), hosts.index(node), len(hosts)
