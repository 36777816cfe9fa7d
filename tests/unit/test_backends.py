"""The launcher's backend contract (trimtab.launch.backends), run against the backends
that need no cluster: a role starts where the backend puts it, bound on that host's
address, its output comes back line by line, its status once it ends, and a signal
stops it and what it started. (Ray and Slurm: tests/integration, slow tier.)"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator

import pytest

from trimtab.errors import ConfigError
from trimtab.launch.backends import (
    HOST,
    Backend,
    LocalBackend,
    RoleSpec,
    TestbedBackend,
    backend_for,
)
from trimtab.launch.spec import LaunchConfig
from trimtab.launch.testbed import unavailable

SAY_HOST = "import sys; print('bound', sys.argv[1]); print('done', flush=True)"


@pytest.fixture(params=["local", "testbed"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[Backend, str]]:
    """A backend that is up, and the address a role of it binds."""
    if request.param == "local":
        made: Backend = LocalBackend("127.0.0.1")
    else:
        if (why := unavailable()) is not None:
            pytest.skip(f"no test bed here: {why}")
        made = TestbedBackend(servers=1, workers=1, hosts=1)
    made.up()
    try:
        address = "127.0.0.1"
        if isinstance(made, TestbedBackend):
            assert made.bed is not None
            address = made.bed.hosts[0].address
        yield made, address
    finally:
        made.down()


def test_a_role_runs_bound_where_the_backend_put_it(backend: tuple[Backend, str]) -> None:
    made, address = backend
    role = made.start(RoleSpec("server", 0, [sys.executable, "-c", SAY_HOST, HOST], {}))
    assert [line.decode().strip() for line in role.lines()] == [f"bound {address}", "done"]
    assert role.wait(10) == 0 and role.poll() == 0


def test_a_signal_stops_a_role_and_its_status_says_so(backend: tuple[Backend, str]) -> None:
    made, _ = backend
    argv = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    role = made.start(RoleSpec("worker", 0, argv, {}))
    lines = role.lines()
    assert next(lines).strip() == b"up"
    role.signal(signal.SIGKILL, group=True)
    assert role.wait(10) == -signal.SIGKILL
    role.signal(signal.SIGTERM)  # ended: never raises


def test_a_role_is_one_of_three_kinds() -> None:
    with pytest.raises(ValueError, match="coordinator"):
        RoleSpec("scheduler", 0, ["true"], {})
    assert RoleSpec("worker", 3, ["x"], {}).source == "worker 3"


def test_the_config_picks_the_backend_and_refuses_what_cannot_work() -> None:
    assert isinstance(backend_for(LaunchConfig()), LocalBackend)
    assert isinstance(backend_for(LaunchConfig(testbed=2)), TestbedBackend)
    with pytest.raises(ConfigError, match="--backend ray"):
        LaunchConfig(address="10.0.0.1:6379")
    with pytest.raises(ConfigError, match="drop --backend"):
        LaunchConfig(testbed=2, backend="ray")
    with pytest.raises(ConfigError, match="allocation"):
        backend_for(LaunchConfig(backend="slurm"))  # not inside one here


SAY_NICE = (
    "import json, os; from trimtab.launch import niceness; "
    "print(json.dumps([niceness.nices(), os.environ.get(niceness.ENV)]), flush=True)"
)


def test_the_bed_starts_a_late_server_at_the_lowest_priority_and_no_other_role() -> None:
    """A server started while the job runs begins at nice 19, its threads and its
    session's group, and is told the launcher's nice value to take back; the job's
    first servers and a late worker start as every process does (a new session's group
    at 0, the launcher's nice)."""
    import json
    import os

    from trimtab.launch import niceness

    if (why := unavailable()) is not None:
        pytest.skip(f"no test bed here: {why}")
    if (cannot := niceness.why_not(os.getpriority(os.PRIO_PROCESS, 0))) is not None:
        pytest.skip(f"this process could not raise a priority back: {cannot}")
    made = TestbedBackend(servers=1, workers=1, hosts=1)
    made.up()
    try:
        assert made.cannot_lower is None
        assert "begin at nice 19 until they serve" in (made.where() or "")
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        seen = {}
        env = {"PYTHONPATH": os.pathsep.join(sys.path)}  # (this tree's trimtab)
        argv = [sys.executable, "-c", SAY_NICE]
        for name, role in {
            "first server": RoleSpec("server", 0, argv, env),
            "late server": RoleSpec("server", 1, argv, env, late=True),
            "late worker": RoleSpec("worker", 1, argv, env, late=True),
        }.items():
            handle = made.start(role)
            seen[name] = json.loads(b"".join(handle.lines()))
            assert handle.wait(10) == 0
    finally:
        made.down()
    grouped = seen["first server"][0][1] is not None  # (the kernel groups sessions)
    group = niceness.START_NICE if grouped else None
    assert seen["late server"] == [[[niceness.START_NICE], group], str(mine)]
    for name in ("first server", "late worker"):
        assert seen[name] == [[[mine], 0 if grouped else None], None], name


def test_the_bed_starts_every_role_at_normal_priority_where_it_could_not_raise_it_back() -> None:
    """Never lowered by a launcher that could not raise it back: a clear no-op, said in
    the job's ``where`` line."""
    made = TestbedBackend(servers=1, workers=1, hosts=1)
    made.cannot_lower = "raising a priority back needs root"
    assert not made.starts_low(RoleSpec("server", 1, ["x"], {}, late=True))
    made.cannot_lower = None
    assert made.starts_low(RoleSpec("server", 1, ["x"], {}, late=True))
    assert not made.starts_low(RoleSpec("server", 0, ["x"], {}))
    assert not made.starts_low(RoleSpec("worker", 2, ["x"], {}, late=True))
