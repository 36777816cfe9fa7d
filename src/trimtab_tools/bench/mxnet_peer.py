"""The MXNet peer of ``trimtab bench datapath --peers mxnet``: a ``dist_sync`` KVStore job.

MXNet 1.9.1's KVStore over ps-lite is the C++ parameter server PSLD was built on. The
peer runs the datapath workload on it: a scheduler, 2 servers and 2 workers as real
processes of an interpreter from a venv of its own (see :mod:`trimtab_tools.bench._venv`;
MXNet 1.9.1 needs ``numpy<1.24``, trimtab ``numpy>=1.24``), the same tensors, SGD on the
servers, push then pull per step (``_mxnet_worker.py``).

Every process is told to stay on loopback: ``DMLC_PS_ROOT_URI`` and ``DMLC_NODE_HOST``
are 127.0.0.1 and ``DMLC_INTERFACE`` is ``lo`` (without them ps-lite picks a
non-loopback interface). MXNet's own tuning is left as a user would have it; in
particular ``MXNET_KVSTORE_BIGARRAY_BOUND`` keeps its default of 1,000,000 elements, so
the tensors of 4 MiB and more are split evenly over both servers and the smaller ones go
whole to one server each.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trimtab.launch.hosts import Layout
from trimtab.launch.testbed import Host
from trimtab_tools.bench._mxnet_worker import RESULT
from trimtab_tools.bench._venv import ToolUnavailable, default_cache_dir, ensure_venv
from trimtab_tools.bench.procs import Job, step_figures

__all__ = [
    "REQUIREMENTS",
    "ToolUnavailable",
    "default_venv",
    "mxnet_python",
    "role_env",
    "run_mxnet",
]

REQUIREMENTS = ("mxnet==1.9.1", "numpy<1.24")
_CHECK = "import mxnet; print(mxnet.__version__)"
_HOST = "127.0.0.1"
_WORKER_SCRIPT = Path(__file__).with_name("_mxnet_worker.py")


def default_venv() -> Path:
    """``$TRIMTAB_MXNET_VENV``, else ``mxnet-venv`` in the cache folder."""
    env = os.environ.get("TRIMTAB_MXNET_VENV")
    return Path(env) if env else default_cache_dir() / "mxnet-venv"


def mxnet_python(venv: Path, *, install: bool = True) -> tuple[Path, str]:
    """The interpreter of a venv with MXNet 1.9.1, and the MXNet version it imports.

    Makes the venv (``pip install mxnet==1.9.1 'numpy<1.24'``) when it has no MXNet and
    ``install`` is true. Blocks: about a second when ready, a download when not.
    Raises :class:`ToolUnavailable` saying why MXNet cannot be had.
    """
    return ensure_venv(venv, REQUIREMENTS, _CHECK, install=install)


def role_env(
    role: str,
    port: int,
    *,
    servers: int,
    workers: int,
    base: Mapping[str, str],
    local: bool = False,
    host: str = _HOST,
    root: str = _HOST,
    interface: str = "lo",
) -> dict[str, str]:
    """The environment of one ps-lite process: ``base`` less any inherited ``DMLC_*``,
    Python path or venv setting, plus the job's ``DMLC_*`` settings, loopback only.
    ``local``: ``DMLC_LOCAL=1``, ps-lite's one-machine mode (Unix-domain ``ipc://``
    sockets under /tmp instead of TCP). On a test bed: ``host``, the process's own
    address, ``root``, the scheduler's, and ``interface``, the host's (``eth0``).

    Pure. Raises ``ValueError`` for an unknown role or a port outside 1-65535.
    """
    if role not in ("scheduler", "server", "worker"):
        raise ValueError(f"unknown ps-lite role {role!r}")
    if not 0 < port < 65536:
        raise ValueError(f"bad port {port}")
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in base.items() if not k.startswith(("DMLC_", "PS_")) and k not in drop}
    env.update(
        {
            "DMLC_ROLE": role,
            "DMLC_PS_ROOT_URI": root,
            "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(servers),
            "DMLC_NUM_WORKER": str(workers),
            "DMLC_NODE_HOST": host,
            "DMLC_INTERFACE": interface,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if local:
        env["DMLC_LOCAL"] = "1"
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        port: int = s.getsockname()[1]
        return port


def run_mxnet(
    python: Path,
    sizes: Sequence[int],
    steps: int,
    *,
    warmup: int = 3,
    servers: int = 2,
    workers: int = 2,
    timeout_s: float | None = None,
    local: bool = False,
    layout: Layout | None = None,
) -> dict[str, Any]:
    """Time ``steps`` push+pull steps of a ``dist_sync`` KVStore job after ``warmup``.

    Starts a scheduler, ``servers`` servers and ``workers`` workers with ``python`` (an
    interpreter that imports MXNet, see :func:`mxnet_python`), all on 127.0.0.1 with a
    free scheduler port (``local``: over ps-lite's ``ipc://`` sockets, see
    :func:`role_env`), and waits for them. With a test bed's ``layout``, each process
    runs on the host where trimtab's role of the same kind and rank runs (the scheduler
    on the coordinator's), over the bed's links. Every process runs in its own process
    group; on success, failure or timeout, whatever is still alive is terminated, then
    killed, and reaped before this returns: nothing is left behind.

    Blocks for the job: the interpreters' start (a few seconds: ``import mxnet`` is
    slow) plus ``warmup + steps`` steps; at most ``timeout_s`` (default ``60 + 5 s`` a
    step).

    Returns:
        ``{"median_s", "p90_s", "steps", "version", "bigarray_bound"}`` measured on the
        worker ps-lite ranks 0.

    Raises:
        ValueError: ``steps < 1``, ``warmup < 0``, or no sizes.
        RuntimeError: a process failed, the job timed out, the results were wrong, or no
            result came; the message holds the last lines the processes printed.
    """
    if steps < 1 or warmup < 0 or not sizes:
        raise ValueError(f"need steps >= 1, warmup >= 0 and sizes: {steps}, {warmup}, {sizes}")
    if timeout_s is None:
        timeout_s = 60.0 + 5.0 * (warmup + steps)
    job = Job("mxnet")
    port = _free_port()
    base = dict(os.environ)

    where = layout or Layout()
    root = where.address(where.coordinator, _HOST)

    def env(role: str, host: Host | None) -> dict[str, str]:
        return role_env(
            role,
            port,
            servers=servers,
            workers=workers,
            base=base,
            local=local,
            host=where.address(host, _HOST),
            root=root,
            interface="lo" if host is None else "eth0",
        )

    started = time.monotonic()
    try:
        serve = [str(python), "-c", "import mxnet"]  # importing mxnet runs the role
        on = where.coordinator
        job.spawn("scheduler", where.run(on, serve), env("scheduler", on))
        for i in range(servers):
            on = where.server(i)
            job.spawn(f"server {i}", where.run(on, serve), env("server", on))
        work = [str(python), str(_WORKER_SCRIPT), "--sizes", ",".join(map(str, sizes))]
        work += ["--steps", str(steps), "--warmup", str(warmup)]
        names = [f"worker {i}" for i in range(workers)]
        for rank, name in enumerate(names):
            on = where.worker(rank)
            job.spawn(name, where.run(on, work), env("worker", on))
        failed = job.wait(names, started + timeout_s)
        if failed is None:
            # ps-lite ends the scheduler and servers once every worker finalized.
            failed = job.wait([n for n, _ in job.procs], time.monotonic() + 10.0)
            if failed == "timed out":
                failed = None  # the measurement is done; the stragglers are killed below
    finally:
        job.stop()
    result = job.result(failed, timeout_s, RESULT, steps, "MXNet dist_sync")
    return {
        **step_figures(result["times"]),
        "version": result["version"],
        "bigarray_bound": result["bigarray_bound"],
    }
