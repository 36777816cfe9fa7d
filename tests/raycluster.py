"""A real Ray cluster on the test bed, as a pytest fixture: the head node in one host
(network namespace) and a worker node in another, each a ``ray start --block`` of its
own, with 2 CPUs, no dashboard, a small object store and usage statistics off.

Skipped, with the reason, where Ray is not installed or no bed can be made. Stopped at
the end: each ``ray start --block`` is sent SIGTERM (it stops what it started), then any
process still in the bed's namespaces, all of them this fixture's, is killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trimtab.launch.testbed import Testbed, unavailable

__all__ = ["RayCluster", "kill_all_in", "kill_all_in_host", "ray_cluster", "ray_missing", "ray_on"]

PORT = 6379
RAY = str(Path(sys.executable).with_name("ray"))
ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


@dataclasses.dataclass
class RayCluster:
    """The bed (host 0: the head node; host 1: a worker node) and the head's address."""

    bed: Testbed
    address: str
    logs: Path

    def driver(self, code: str, timeout: float = 120.0) -> str:
        """Run ``code`` as a Ray driver in the head's host (``ray`` imported, connected
        to the cluster in trimtab's namespace); its stdout. Fails the test if it fails."""
        script = (
            "import ray\n"
            f"ray.init(address={self.address!r}, namespace='trimtab', log_to_driver=False)\n" + code
        )
        argv = self.bed.hosts[0].argv([sys.executable, "-c", script])
        done = subprocess.run(
            argv, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout


def _ray_start(bed: Testbed, host: int, extra: list[str], log: Path) -> subprocess.Popen[bytes]:
    h = bed.hosts[host]
    argv = [
        RAY, "start", "--block", "--disable-usage-stats", "--num-cpus=2",
        "--object-store-memory=100000000", f"--node-ip-address={h.address}", *extra,
    ]  # fmt: skip
    with open(log, "wb") as out:
        return subprocess.Popen(
            h.argv(argv),
            env={**os.environ, **ENV},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _nodes_alive(cluster: RayCluster) -> int:
    out = subprocess.run(
        cluster.bed.hosts[0].argv([RAY, "status", f"--address={cluster.address}"]),
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return out.split("Pending:")[0].count("node_")


@contextlib.contextmanager
def ray_on(bed: Testbed) -> Iterator[RayCluster]:
    """A Ray cluster on ``bed``'s hosts 0 (head) and 1, stopped on leaving. Blocks until
    both nodes are up (seconds). Raises AssertionError, with the logs, if they do not
    come up in 90 s."""
    logs = Path(tempfile.mkdtemp(prefix="trimtab-ray-"))
    head_address = f"{bed.hosts[0].address}:{PORT}"
    cluster = RayCluster(bed, head_address, logs)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        head = ["--head", f"--port={PORT}", "--include-dashboard=false", f"--temp-dir={logs}/ray"]
        procs.append(_ray_start(bed, 0, head, logs / "head.log"))
        deadline = time.monotonic() + 90
        while _nodes_alive(cluster) < 1:
            assert time.monotonic() < deadline, (logs / "head.log").read_text()[-3000:]
            time.sleep(1)
        procs.append(_ray_start(bed, 1, [f"--address={head_address}"], logs / "node.log"))
        while _nodes_alive(cluster) < 2:
            assert time.monotonic() < deadline, (logs / "node.log").read_text()[-3000:]
            time.sleep(1)
        yield cluster
    finally:
        for p in procs:
            with_signal(p, signal.SIGTERM)
        stop_by = time.monotonic() + 5  # (Ray would drain for up to 30 s: none needed)
        for p in procs:
            try:
                p.wait(max(0.1, stop_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                with_signal(p, signal.SIGKILL)
                p.wait()
        kill_all_in(bed)
        shutil.rmtree(logs, ignore_errors=True)


def kill_all_in(bed: Testbed) -> None:
    """Kill every process left in ``bed``'s namespaces (all of them the caller's)."""
    for h in bed.hosts:
        kill_all_in_host(h.namespace)


def kill_all_in_host(namespace: str) -> None:
    """Kill every process in the bed host ``namespace`` (all of them the caller's), as
    a machine that dies: ``SIGKILL``, no warning."""
    pids = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True
    ).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def ray_missing() -> str | None:
    """Why no Ray cluster can be made here, or None."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed: pip install 'trimtab[ray]'"
    why = unavailable()
    return None if why is None else f"no multi-host test bed here: {why}"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    why = ray_missing()
    if why is not None:
        pytest.skip(why)
    with Testbed(2) as bed, ray_on(bed) as cluster:
        yield cluster


def with_signal(p: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to ``p``'s process group; nothing if it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)
