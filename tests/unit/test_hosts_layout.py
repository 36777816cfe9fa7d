"""The launcher's layout of a job's roles on the hosts of a test bed (no bed needed)."""

from __future__ import annotations

import pytest

from trimtab.launch.hosts import Layout, place
from trimtab.launch.testbed import Host

HOSTS = [Host(i, f"ttb1a-{i}", f"10.77.1.{i + 1}", f"ttb1av{i}") for i in range(4)]


def test_each_role_on_its_own_host_but_the_coordinator() -> None:
    layout = place(HOSTS, servers=2, workers=2)
    assert layout.coordinator == HOSTS[0]
    assert [layout.server(i) for i in range(3)] == [HOSTS[0], HOSTS[1], HOSTS[2]]
    assert [layout.worker(r) for r in range(2)] == [HOSTS[2], HOSTS[3]]
    assert layout.address(layout.worker(1), "127.0.0.1") == "10.77.1.4"
    assert layout.run(HOSTS[3], ["python"])[-3:] == ["exec", "ttb1a-3", "python"]
    # One worker per host: local rank 0 of 1, hosts counted among the workers' only.
    assert layout.local(0, 2) == (0, 1, 0, 2)
    assert layout.local(1, 2) == (0, 1, 1, 2)


def test_workers_sharing_a_host_are_ranked_on_it() -> None:
    layout = place(HOSTS[:2], servers=1, workers=3)  # workers on hosts 1, 0, 1
    assert [layout.local(r, 3) for r in range(3)] == [(0, 2, 0, 2), (0, 1, 1, 2), (1, 2, 0, 2)]


def test_without_a_bed_everything_is_this_machine() -> None:
    layout = Layout()
    assert layout.coordinator is None and layout.server(5) is None and layout.worker(0) is None
    assert layout.run(None, ["python", "x.py"]) == ["python", "x.py"]
    assert layout.address(None, "127.0.0.1") == "127.0.0.1"
    assert layout.local(1, 3) == (1, 3, 0, 1)


def test_a_layout_needs_hosts() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        place([], servers=1, workers=1)


def test_a_job_on_a_bed_that_cannot_be_made_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import trimtab.launch.testbed as testbed
    from trimtab.launch.job import Job, LaunchConfig

    monkeypatch.setattr(testbed, "unavailable", lambda: "no namespaces in this test")
    said: list[str] = []
    job = Job(
        LaunchConfig(workers=1, servers=1, testbed=2),
        ["true"],
        output=lambda src, line: said.append(f"[{src}] {line}"),
    )
    assert job.run() == 2
    assert said == ["[trimtab] no namespaces in this test"]
