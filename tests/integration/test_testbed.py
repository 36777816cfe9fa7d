"""The multi-host test bed: hosts that reach each other only, kernel shaping, clean-up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.testbed import testbed_factory  # noqa: F401 (a fixture)
from trimtab.launch import tcprate
from trimtab.launch.netns import NamespaceError
from trimtab.launch.testbed import Host, Testbed, list_beds, remove_stale

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}

Factory = Callable[[int], Testbed]


def _in_host(bed: Testbed, host: int, code: str, timeout: float = 30) -> str:
    out = subprocess.run(
        bed.exec_argv(host, [sys.executable, "-c", code]),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        check=True,
    )
    return out.stdout


def _greeter(bed: Testbed, host: int) -> tuple[subprocess.Popen[str], int]:
    """A process on ``host`` that answers one TCP connection with the address it came
    from; and its port. The caller kills it."""
    address = bed.hosts[host].address
    code = (
        f"import socket\ns = socket.create_server(({address!r}, 0)); "
        "print(s.getsockname()[1], flush=True)\n"
        "c, a = s.accept(); c.sendall(a[0].encode()); c.close()"
    )
    server = subprocess.Popen(
        bed.exec_argv(host, [sys.executable, "-c", code]), stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def test_hosts_reach_each_other_and_nothing_else(testbed_factory: Factory) -> None:  # noqa: F811
    bed = testbed_factory(3)
    addresses = [h.address for h in bed.hosts]
    assert len(set(addresses)) == 3
    assert all(a.startswith("10.77.") for a in addresses)
    # Host 0 serves; host 2 reaches it by its bed address.
    server, port = _greeter(bed, 0)
    try:
        seen = _in_host(
            bed,
            2,
            f"import socket\nc = socket.create_connection(({addresses[0]!r}, {port}), 10)\n"
            "print(c.recv(100).decode())",
        )
        assert seen.strip() == addresses[2]  # the peer's own address, not a NAT's
    finally:
        server.kill()
        server.wait()
    # No default route in a host, and the machine itself has no address on the bed.
    routes = subprocess.run(
        ["ip", "-n", bed.hosts[1].namespace, "route"], capture_output=True, text=True, check=True
    ).stdout
    assert "default" not in routes
    with pytest.raises(OSError), socket.create_connection((addresses[0], port), 1):
        pass


def test_a_thread_of_this_process_reaches_a_host_from_inside_another(
    testbed_factory: Factory,  # noqa: F811
) -> None:
    """How the launcher asks a job's coordinator on a bed for its status: a thread that
    joined host 1's namespace connects to host 0's address (the machine's own namespace
    cannot), and the rest of the process stays where it was."""
    bed = testbed_factory(2)
    address = bed.hosts[0].address
    server, port = _greeter(bed, 0)
    try:

        def ask() -> str:
            with socket.create_connection((address, port), 10) as c:
                return c.recv(100).decode()

        assert bed.hosts[1].call(ask) == bed.hosts[1].address  # seen as host 1
    finally:
        server.kill()
        server.wait()
    with pytest.raises(OSError), socket.create_connection((address, port), 1):
        pass  # this thread never left the machine's namespace
    with pytest.raises(NamespaceError, match="no network namespace"):
        Host(9, "ttb0z-9", "10.77.255.9", "none").call(lambda: None)


def test_two_beds_do_not_collide(testbed_factory: Factory) -> None:  # noqa: F811
    one, two = testbed_factory(2), testbed_factory(2)
    assert one.id != two.id and one.subnet != two.subnet
    ours = {b.id: b for b in list_beds()}
    assert {h.namespace for h in ours[one.id].hosts} == {h.namespace for h in one.hosts}
    assert ours[one.id].alive and ours[two.id].alive
    one.down()
    ids = {b.id for b in list_beds()}
    assert one.id not in ids and two.id in ids


def test_one_stream_is_measured_with_the_cores_it_kept_busy() -> None:
    # Two real processes on loopback (no bed needed): the floor's measure itself.
    stream = tcprate.measure_stream([], [], "127.0.0.1", seconds=0.3)
    assert stream.bytes_per_s > 1e6
    # The sender and the receiver ran on the machine: something was busy, at most all.
    cores = os.cpu_count() or 1
    assert stream.cores_busy is None or 0 < stream.cores_busy <= cores + 1  # ticks: +-10 ms


def test_kernel_shapes_the_link(testbed_factory: Factory) -> None:  # noqa: F811
    bed = testbed_factory(2)
    bed.shape(1, rate_mbit=80)  # 10 MB/s into host 1
    stream = bed.tcp_stream(0, 1, seconds=1.0)
    shaped = stream.bytes_per_s
    # An upper bound only: a busy machine may be slower, never faster than the bucket.
    assert 0 < shaped < 1.25 * 10e6
    assert stream.cores_busy is None or stream.cores_busy >= 0
    bed.shape(1)
    qdiscs = subprocess.run(
        ["ip", "netns", "exec", bed.hosts[1].namespace, "tc", "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "tbf" not in qdiscs


def test_a_bed_left_by_a_killed_run_is_removed() -> None:
    from trimtab.launch.testbed import unavailable

    if (why := unavailable()) is not None:
        pytest.skip(f"no multi-host test bed here: {why}")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom trimtab.launch.testbed import Testbed\n"
            "b = Testbed(2); b.up(); print(b.id, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert child.stdout is not None
    bed = child.stdout.readline().strip()
    os.kill(child.pid, signal.SIGKILL)  # no finalizer, no atexit
    child.wait()
    left = {b.id: b for b in list_beds()}
    assert bed in left and not left[bed].alive
    assert bed in remove_stale()
    assert bed not in {b.id for b in list_beds()}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert bed not in links


def test_cli_up_status_down() -> None:
    from trimtab.launch.testbed import unavailable

    if (why := unavailable()) is not None:
        pytest.skip(f"no multi-host test bed here: {why}")
    cli = [sys.executable, "-m", "trimtab", "testbed"]
    up = subprocess.run(
        [*cli, "up", "--hosts", "2", "--json"], capture_output=True, text=True, env=ENV, check=True
    )
    made = json.loads(up.stdout)
    try:
        status = json.loads(
            subprocess.run(
                [*cli, "status", "--json"], capture_output=True, text=True, env=ENV, check=True
            ).stdout
        )
        [mine] = [b for b in status if b["id"] == made["id"]]
        assert [h["address"] for h in mine["hosts"]] == [h["address"] for h in made["hosts"]]
        subprocess.run([*cli, "down"], capture_output=True, env=ENV, check=True)
        assert made["id"] not in {b.id for b in list_beds()}
    finally:
        for b in list_beds():
            if b.id == made["id"]:
                remove_stale(everything=False)


def test_cli_rate_measures_one_stream_and_the_cores_it_kept_busy() -> None:
    from trimtab.launch.testbed import unavailable

    if (why := unavailable()) is not None:
        pytest.skip(f"no multi-host test bed here: {why}")
    cli = [sys.executable, "-m", "trimtab", "testbed", "rate", "--seconds", "0.3"]
    out = subprocess.run(
        [*cli, "--rate", "80", "--json"], capture_output=True, text=True, env=ENV, check=True
    )
    got = json.loads(out.stdout)
    assert 0 < got["bytes_per_s"] < 1.25 * 10e6 and got["shaped_mbit"] == 80
    # (/proc/stat counts every CPU of the machine, a container's host's too)
    assert got["cores_busy"] is None or 0 <= got["cores_busy"] <= (os.cpu_count() or 1) + 1
    text = subprocess.run(cli, capture_output=True, text=True, env=ENV, check=True).stdout
    assert "MB/s (unshaped)" in text and "cores busy" in text


def test_without_the_capabilities_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import trimtab.launch.testbed as testbed

    real = testbed.Path

    class NoCaps:
        def __init__(self, path: str) -> None:
            self.path = path

        def read_text(self) -> str:
            if self.path == "/proc/self/status":
                return "Name:\tpython\nCapEff:\t0000000000000000\n"
            return real(self.path).read_text()

    monkeypatch.setattr(testbed, "Path", NoCaps)
    assert "CAP_NET_ADMIN" in (testbed.unavailable() or "")
    with pytest.raises(testbed.TestbedError, match="needs root"):
        Testbed(2).up()
