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
