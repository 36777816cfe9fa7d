"""Every environment variable the launcher and the CLI read or set, in one place.

The runtime below reads none: the edges (the CLI, the launcher, and a worker's
``trimtab.init()``) read them and pass settings down as arguments. Names that a
worker's ``init()`` reads too are defined beside their parser in the layer that parses
them (``TRIMTAB_SPIN_US`` in :mod:`trimtab.transport.spin`, ``TRIMTAB_LANE`` in
:mod:`trimtab.transport.zmq`, ...) and listed here again, so that this module names
them all. ``DMLC_*`` names are ps-lite's, for MXNet and BytePS users.

Every reader takes the environment as an argument (``os.environ`` at the edges, a dict
in tests); none blocks.
"""

from __future__ import annotations

from collections.abc import Mapping

from trimtab.errors import ConfigError
from trimtab.faults.kills import ENV as FAULTS
from trimtab.faults.stragglers import ENV as STRAGGLERS
from trimtab.frontend.compression import ENV as COMPRESSION
from trimtab.launch.niceness import ENV as SERVING_NICE
from trimtab.runtime.trace import ENV as TRACE
from trimtab.runtime.trace import LIMIT_ENV as TRACE_EVENTS
from trimtab.transport.auth import AUTH_ENV as AUTH
from trimtab.transport.auth import ENCRYPT_ENV as ENCRYPT
from trimtab.transport.auth import SECRET_FILE_ENV as SECRET_FILE
from trimtab.transport.shm import ENV as SHM
from trimtab.transport.spin import SPIN_ENV as SPIN_US
from trimtab.transport.zmq import LANE_ENV as LANE

__all__ = [
    "AUTH",
    "COMPRESSION",
    "COORDINATOR",
    "COORDINATOR_TIMEOUT_S",
    "CROSS_RANK",
    "CROSS_SIZE",
    "DMLC_NODE_HOST",
    "DMLC_NUM_SERVER",
    "DMLC_NUM_WORKER",
    "DMLC_PS_ROOT_PORT",
    "DMLC_PS_ROOT_URI",
    "DMLC_ROLE",
    "DMLC_WORKER_ID",
    "ENCRYPT",
    "FAULTS",
    "JOB",
    "LANE",
    "LOCAL_RANK",
    "LOCAL_SIZE",
    "NUM_SERVERS",
    "NUM_WORKERS",
    "PRIORITY",
    "RANK",
    "SECRET_FILE",
    "SERVER_KEY",
    "SERVING_NICE",
    "SHM",
    "SPIN_US",
    "STRAGGLERS",
    "TRACE",
    "TRACE_EVENTS",
    "coordinator_address",
    "dead_after_s",
    "env_int",
    "job_id",
    "priority",
]

#: A job's server key, hex, given by hand (servers' join tickets are made from it); by
#: default the coordinator and the servers derive it from the job's secret. A job
#: without authentication (``--no-auth``) gets one from its launcher.
SERVER_KEY = "TRIMTAB_SERVER_KEY"

#: The coordinator's address, ``tcp://HOST:PORT`` (else ``DMLC_PS_ROOT_URI``/``_PORT``).
COORDINATOR = "TRIMTAB_COORDINATOR"
#: The job id every node of a job shares.
JOB = "TRIMTAB_JOB"
#: A worker's rank, its rank on its machine, and the workers on its machine.
RANK = "TRIMTAB_RANK"
LOCAL_RANK = "TRIMTAB_LOCAL_RANK"
LOCAL_SIZE = "TRIMTAB_LOCAL_SIZE"
#: A worker's machine among the job's, and how many machines run workers (Horovod's
#: ``cross_rank()``/``cross_size()``; unset on one machine: 0 and 1).
CROSS_RANK = "TRIMTAB_CROSS_RANK"
CROSS_SIZE = "TRIMTAB_CROSS_SIZE"
#: The job's worker and server counts (``trimtab coordinator``'s defaults).
NUM_WORKERS = "TRIMTAB_NUM_WORKERS"
NUM_SERVERS = "TRIMTAB_NUM_SERVERS"
#: ``0``: a server merges queued pushes in arrival order (``trimtab server --no-priority``).
PRIORITY = "TRIMTAB_PRIORITY"
#: Seconds of silence after which the coordinator takes a member for dead (30 by
#: default; a job with ``--replicas 1`` fails over then).
DEAD_AFTER_S = "TRIMTAB_DEAD_AFTER_S"
#: Seconds a server or worker waits for a silent coordinator, or for the replacement of
#: a dead one (30 by default), before it ends (read by ``trimtab server`` and ``init()``).
COORDINATOR_TIMEOUT_S = "TRIMTAB_COORDINATOR_TIMEOUT_S"

DMLC_ROLE = "DMLC_ROLE"
DMLC_PS_ROOT_URI = "DMLC_PS_ROOT_URI"
DMLC_PS_ROOT_PORT = "DMLC_PS_ROOT_PORT"
DMLC_NUM_WORKER = "DMLC_NUM_WORKER"
DMLC_NUM_SERVER = "DMLC_NUM_SERVER"
DMLC_WORKER_ID = "DMLC_WORKER_ID"
DMLC_NODE_HOST = "DMLC_NODE_HOST"

#: The job id of a node started by hand without ``--job`` or ``TRIMTAB_JOB``.
DEFAULT_JOB = "trimtab"


def env_int(environ: Mapping[str, str], *names: str, default: int) -> int:
    """The first of ``names`` set (non-empty) in ``environ``, as an int, else ``default``.
    Raises :class:`ConfigError` naming the variable if it is not a whole number."""
    for name in names:
        raw = environ.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} must be a whole number") from None
    return default


def dead_after_s(environ: Mapping[str, str], default: float) -> float:
    """``TRIMTAB_DEAD_AFTER_S`` as seconds, else ``default``. Raises
    :class:`ConfigError` if it is not a positive number."""
    raw = environ.get(DEAD_AFTER_S)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{DEAD_AFTER_S}={raw!r} must be a positive number of seconds")
    return value


def coordinator_address(environ: Mapping[str, str]) -> str | None:
    """The coordinator's address from ``TRIMTAB_COORDINATOR``, else from
    ``DMLC_PS_ROOT_URI`` and ``DMLC_PS_ROOT_PORT``; ``None`` if neither is set."""
    if environ.get(COORDINATOR):
        return environ[COORDINATOR]
    host, port = environ.get(DMLC_PS_ROOT_URI), environ.get(DMLC_PS_ROOT_PORT)
    return f"tcp://{host}:{port}" if host and port else None


def job_id(environ: Mapping[str, str]) -> str:
    """``TRIMTAB_JOB``, else :data:`DEFAULT_JOB`."""
    return environ.get(JOB, DEFAULT_JOB)


def priority(environ: Mapping[str, str]) -> bool:
    """Whether servers merge the first layers' pushes first (unless ``TRIMTAB_PRIORITY=0``)."""
    return environ.get(PRIORITY, "1") != "0"
