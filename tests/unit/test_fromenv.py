"""Roles from the environment alone (trimtab.launch.fromenv): what a scheduler's
variables make of each role."""

from __future__ import annotations

import pytest

from trimtab.errors import ConfigError
from trimtab.launch.fromenv import role_command, setting_variables

BASE = {
    "TRIMTAB_COORDINATOR": "tcp://127.0.0.1:9555",
    "TRIMTAB_NUM_WORKERS": "3",
    "TRIMTAB_NUM_SERVERS": "2",
    "TRIMTAB_SECRET_FILE": "/run/secrets/trimtab/secret",
    "TRIMTAB_JOB": "j1",
}
TRAIN = ["python", "train.py"]


def test_the_coordinator_binds_the_fixed_port_with_every_setting_given() -> None:
    env = {
        **BASE,
        "TRIMTAB_ROLE": "coordinator",
        "TRIMTAB_CHUNK_BYTES": "4096",
        "TRIMTAB_PLACEMENT": "greedy",
        "TRIMTAB_REPLICAS": "1",
    }
    role = role_command(env, TRAIN)
    assert role.role == "coordinator"
    argv = role.argv
    assert argv[argv.index("--port") + 1] == "9555"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--workers") + 1] == "3"
    assert argv[argv.index("--chunk-bytes") + 1] == "4096"
    assert argv[argv.index("--placement") + 1] == "greedy"
    assert argv[argv.index("--replicas") + 1] == "1"
    assert "python" not in argv[1:] and "train.py" not in argv


def test_a_server_binds_the_interface_that_reaches_the_coordinator() -> None:
    role = role_command({**BASE, "TRIMTAB_ROLE": "server"}, TRAIN)
    argv = role.argv
    assert argv[argv.index("server") + 1 :][:2] == ["--coordinator", "tcp://127.0.0.1:9555"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    role = role_command({**BASE, "TRIMTAB_ROLE": "server", "TRIMTAB_HOST": "10.0.0.7"}, TRAIN)
    assert role.argv[role.argv.index("--host") + 1] == "10.0.0.7"


@pytest.mark.parametrize(
    ("extra", "rank"),
    [
        ({"TRIMTAB_ROLE": "worker", "TRIMTAB_RANK": "2"}, 2),
        ({"TRIMTAB_ROLE": "worker", "JOB_COMPLETION_INDEX": "1"}, 1),
        ({"DMLC_ROLE": "worker", "DMLC_WORKER_ID": "0"}, 0),
        ({"SLURM_PROCID": "4", "SLURM_NTASKS": "6"}, 1),  # tasks 1-2 are the servers
    ],
)
def test_a_workers_rank_comes_from_the_schedulers_own_variables(
    extra: dict[str, str], rank: int
) -> None:
    role = role_command({**BASE, **extra}, TRAIN)
    assert role.role == "worker" and role.argv == TRAIN
    assert role.env["TRIMTAB_RANK"] == str(rank)
    assert role.env["TRIMTAB_COORDINATOR"] == "tcp://127.0.0.1:9555"


@pytest.mark.parametrize(
    ("procid", "kind"), [("0", "coordinator"), ("2", "server"), ("3", "worker")]
)
def test_slurm_tasks_are_the_coordinator_then_the_servers_then_the_workers(
    procid: str, kind: str
) -> None:
    assert role_command({**BASE, "SLURM_PROCID": procid}, TRAIN).role == kind


def test_dmlc_names_alone_describe_a_job() -> None:
    env = {
        "DMLC_ROLE": "scheduler",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9100",
        "DMLC_NUM_WORKER": "2",
        "DMLC_NUM_SERVER": "1",
        "TRIMTAB_SECRET_FILE": "/s",
    }
    role = role_command(env, [])
    assert role.role == "coordinator" and role.argv[role.argv.index("--port") + 1] == "9100"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({**BASE, "TRIMTAB_SECRET": "abc", "TRIMTAB_ROLE": "server"}, "as a file"),
        ({**BASE, "TRIMTAB_SECRET_FILE": "", "TRIMTAB_ROLE": "server"}, "TRIMTAB_SECRET_FILE"),
        ({**BASE, "TRIMTAB_ROLE": "scheduler"}, "TRIMTAB_ROLE"),
        ({**BASE, "TRIMTAB_ROLE": "worker"}, "TRIMTAB_RANK"),
        ({**BASE, "TRIMTAB_ROLE": "worker", "TRIMTAB_RANK": "3"}, "outside"),
        ({**BASE, "TRIMTAB_COORDINATOR": "tcp://a:0", "TRIMTAB_ROLE": "server"}, "fixed"),
        ({**BASE, "TRIMTAB_NUM_SERVERS": "", "TRIMTAB_ROLE": "server"}, "NUM_SERVERS"),
        (
            {
                **BASE,
                "TRIMTAB_ROLE": "coordinator",
                "TRIMTAB_RESUME": "x",
                "TRIMTAB_HOST": "h",
                "TRIMTAB_ELASTIC": "2",
            },
            None,
        ),
    ],
)
def test_what_is_missing_or_wrong_is_said(env: dict[str, str], says: str | None) -> None:
    if says is None:  # an unknown TRIMTAB_ variable is no setting: ignored
        role_command(env, TRAIN)
        return
    with pytest.raises(ConfigError, match=says):
        role_command(env, TRAIN)


def test_every_setting_has_a_variable_named_after_its_flag() -> None:
    names = setting_variables()
    assert names["TRIMTAB_CHUNK_BYTES"] == "--chunk-bytes"
    assert names["TRIMTAB_MODE"] == "--mode"
    assert names["TRIMTAB_MAX_SERVERS"] == "--max-servers"
    assert all(n.startswith("TRIMTAB_") and n.isupper() for n in names)
