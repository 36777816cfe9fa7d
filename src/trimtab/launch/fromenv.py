"""A role from its environment alone: what a scheduler (Kubernetes, Slurm, any other)
starts with one command line for every role of a job, in any order.

``trimtab start -- python train.py`` reads:

- the role: ``TRIMTAB_ROLE`` (``coordinator``, ``server`` or ``worker``), else ps-lite's
  ``DMLC_ROLE`` (``scheduler`` is the coordinator), else Slurm's task number: task 0 is
  the coordinator, tasks 1 to S the servers, the rest the workers;
- the coordinator's address: ``TRIMTAB_COORDINATOR`` (``tcp://HOST:PORT``, a name the
  scheduler resolves, e.g. a JobSet's stable host name), else ``DMLC_PS_ROOT_URI`` and
  ``DMLC_PS_ROOT_PORT``; the port is fixed, since the roles are told it before the
  coordinator runs;
- the job's size: ``TRIMTAB_NUM_WORKERS``/``TRIMTAB_NUM_SERVERS`` (or ``DMLC_NUM_*``);
- a worker's rank: ``TRIMTAB_RANK``, ``DMLC_WORKER_ID``, a JobSet's (an indexed Job's)
  ``JOB_COMPLETION_INDEX``, or Slurm's ``SLURM_PROCID`` less the coordinator and servers;
- one variable per setting, named after its flag: ``--chunk-bytes`` is
  ``TRIMTAB_CHUNK_BYTES``, ``--placement`` ``TRIMTAB_PLACEMENT``, a switch ``1``;
- the address a role binds: ``TRIMTAB_HOST`` (or ``DMLC_NODE_HOST``), else that of the
  interface that reaches the coordinator;
- the job's secret: the path of its file, ``TRIMTAB_SECRET_FILE``, which the scheduler
  mounts (a Kubernetes Secret, a file on a shared file system). Never its value: a
  variable ``TRIMTAB_SECRET`` is refused, since a process's environment is readable by
  others (``/proc``, ``kubectl describe``, job records).

:func:`role_command` turns that into the command line and environment of the role's
process, which ``trimtab start`` then becomes (``exec``), so that the scheduler watches
and stops the role itself. Pure but for name resolution; raises :class:`ConfigError`
with what to set.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
from collections.abc import Mapping, Sequence

from trimtab.errors import ConfigError
from trimtab.launch import env as envvars
from trimtab.launch.spec import flag_fields
from trimtab.settings import (
    BatchingSettings,
    CheckpointSettings,
    ConsistencySettings,
    ElasticSettings,
    PlacementSettings,
)

__all__ = ["ROLE", "RoleCommand", "role_command", "setting_variables"]

#: The role of the process: coordinator, server or worker.
ROLE = "TRIMTAB_ROLE"
#: The address a role binds (its pod's, its node's).
HOST = "TRIMTAB_HOST"
#: Refused: the secret's value never travels in an environment.
SECRET_VALUE = "TRIMTAB_SECRET"
#: Slurm's task number and count; an indexed Kubernetes Job's (a JobSet's) index.
SLURM_PROCID = "SLURM_PROCID"
SLURM_NTASKS = "SLURM_NTASKS"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"

_SETTINGS = (
    PlacementSettings,
    ConsistencySettings,
    BatchingSettings,
    ElasticSettings,
    CheckpointSettings,
)
_DMLC_ROLES = {"scheduler": "coordinator", "server": "server", "worker": "worker"}


@dataclasses.dataclass(frozen=True)
class RoleCommand:
    """What a role's process is: its kind, command line and the variables it adds."""

    role: str
    argv: list[str]
    env: dict[str, str]


def setting_variables() -> dict[str, str]:
    """Every setting's variable and the flag it stands for: ``TRIMTAB_CHUNK_BYTES``:
    ``--chunk-bytes``. Never blocks."""
    names: dict[str, str] = {}
    for cls in _SETTINGS:
        for _, meta, _ in flag_fields(cls):
            names["TRIMTAB_" + meta.name.removeprefix("--").upper().replace("-", "_")] = meta.name
    return names


def _setting_flags(environ: Mapping[str, str]) -> list[str]:
    """The coordinator's flags for the settings set in ``environ``."""
    argv: list[str] = []
    switches = {
        meta.name
        for cls in _SETTINGS
        for _, meta, default in flag_fields(cls)
        if isinstance(default, bool)
    }
    for name, option in setting_variables().items():
        value = environ.get(name, "")
        if not value:
            continue
        if option in switches:
            if value not in ("0", "1"):
                raise ConfigError(f"{name}={value!r}: a switch is 1 or 0")
            argv += [option] if value == "1" else []
        else:
            argv += [option, value]
    return argv


def _role(environ: Mapping[str, str], servers: int) -> str:
    role = environ.get(ROLE) or _DMLC_ROLES.get(environ.get(envvars.DMLC_ROLE, ""), "")
    if not role and environ.get(SLURM_PROCID):
        task = envvars.env_int(environ, SLURM_PROCID, default=0)
        return "coordinator" if task == 0 else "server" if task <= servers else "worker"
    if role not in ("coordinator", "server", "worker"):
        raise ConfigError(
            f"which role? set {ROLE} to coordinator, server or worker (or DMLC_ROLE, "
            f"or run under Slurm: task 0 the coordinator, 1 to S the servers)"
            + (f"; not {role!r}" if role else "")
        )
    return role


def _rank(environ: Mapping[str, str], servers: int) -> int:
    if environ.get(SLURM_PROCID) and not environ.get(ROLE) and not environ.get(envvars.RANK):
        return envvars.env_int(environ, SLURM_PROCID, default=0) - 1 - servers
    rank = envvars.env_int(
        environ, envvars.RANK, envvars.DMLC_WORKER_ID, JOB_COMPLETION_INDEX, default=-1
    )
    if rank < 0:
        raise ConfigError(
            f"which worker is this? set {envvars.RANK} (or DMLC_WORKER_ID, or run as an "
            f"indexed Job: {JOB_COMPLETION_INDEX})"
        )
    return rank


def _split(address: str) -> tuple[str, int]:
    """(host, port) of ``tcp://HOST:PORT``. Raises :class:`ConfigError`."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"the coordinator's address {address!r} must be tcp://HOST:PORT with a fixed "
            f"port: the roles are told it before the coordinator runs"
        )
    return host, int(port)


def _resolve(host: str) -> str:
    """``host``'s IPv4 address. Blocks on name resolution. Raises :class:`ConfigError`."""
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ConfigError(f"cannot resolve the coordinator's host {host!r}: {exc}") from None


def own_address(coordinator: str) -> str:
    """The address of this host's interface that reaches ``coordinator``
    (``tcp://HOST:PORT``): a UDP socket's, connected there (nothing is sent). Blocks on
    name resolution. Raises :class:`ConfigError`."""
    host, port = _split(coordinator)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((_resolve(host), port))
        except OSError as exc:
            raise ConfigError(f"no route to the coordinator {coordinator}: {exc}") from None
        return str(s.getsockname()[0])


def role_command(environ: Mapping[str, str], command: Sequence[str]) -> RoleCommand:
    """The process the role that ``environ`` describes runs: ``trimtab coordinator``,
    ``trimtab server`` or ``command`` (a worker), and the variables to add to its
    environment. Blocks on name resolution. Raises :class:`ConfigError` for what is
    missing or wrong, saying what to set."""
    if environ.get(SECRET_VALUE):
        raise ConfigError(
            f"{SECRET_VALUE} holds a secret in the environment, which others can read: "
            f"mount the job's secret as a file and give its path in {envvars.SECRET_FILE}"
        )
    if environ.get(envvars.AUTH, "1") != "0" and not environ.get(envvars.SECRET_FILE):
        raise ConfigError(
            f"the job's secret: mount one file (32 random bytes, mode 0600, the same for "
            f"every role) and give its path in {envvars.SECRET_FILE}"
        )
    workers = envvars.env_int(environ, envvars.NUM_WORKERS, envvars.DMLC_NUM_WORKER, default=0)
    servers = envvars.env_int(environ, envvars.NUM_SERVERS, envvars.DMLC_NUM_SERVER, default=0)
    if workers < 1 or servers < 1:
        raise ConfigError(
            f"how big is the job? set {envvars.NUM_WORKERS} and {envvars.NUM_SERVERS} "
            f"(or DMLC_NUM_WORKER and DMLC_NUM_SERVER) on every role"
        )
    coordinator = envvars.coordinator_address(environ)
    if coordinator is None:
        raise ConfigError(
            f"where is the coordinator? set {envvars.COORDINATOR}=tcp://HOST:PORT (or "
            f"DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT) on every role"
        )
    root, port = _split(coordinator)
    job = envvars.job_id(environ)
    role = _role(environ, servers)
    bind = environ.get(HOST) or environ.get(envvars.DMLC_NODE_HOST)
    common = {
        envvars.COORDINATOR: coordinator,
        envvars.JOB: job,
        envvars.NUM_WORKERS: str(workers),
        envvars.NUM_SERVERS: str(servers),
    }
    trimtab = [sys.executable, "-m", "trimtab"]
    if role == "coordinator":
        argv = [
            *trimtab,
            "coordinator",
            "--workers",
            str(workers),
            "--servers",
            str(servers),
            "--job",
            job,
            "--host",
            bind or _resolve(root),
            "--port",
            str(port),
            *_setting_flags(environ),
        ]
        return RoleCommand(role, argv, common)
    if role == "server":
        argv = [*trimtab, "server", "--coordinator", coordinator, "--job", job]
        return RoleCommand(role, [*argv, "--host", bind or own_address(coordinator)], common)
    if not command:
        raise ConfigError("a worker runs the training command: trimtab start -- python train.py")
    rank = _rank(environ, servers)
    if not 0 <= rank < workers:
        raise ConfigError(f"worker rank {rank} is outside the job's {workers} workers")
    return RoleCommand(
        role,
        list(command),
        {**common, envvars.RANK: str(rank), envvars.DMLC_ROLE: "worker"},
    )
