"""A multi-host test bed on one machine: network namespaces on a bridge.

Each **host** of a :class:`Testbed` is a network namespace with its own network stack:
``lo`` up, one veth whose other end is enslaved to the bed's bridge, an address
``10.77.X.I/24`` and no default route, so nothing can leave the bed. The bridge itself
has no address: the machine's own stack cannot reach the bed either. Links are shaped by
the kernel (:meth:`Testbed.shape`): ``tbf`` for bandwidth and ``netem`` for latency, on
the egress of the host's veth and, for its ingress, on the bridge side.

Names carry the bed's id, the process id of the process that made it and a letter per
bed of that process (``ttb<pid>a``): namespaces ``ttb<pid>a-<i>``, links ``ttb<pid>av<i>``
and the bridge ``ttb<pid>abr`` (interface names have at most 15 characters), so two
beds never collide, and :func:`remove_stale` finds a bed whose owner has gone (a killed
run, or ``trimtab testbed up``, whose process ends at once) and removes it. Each bed takes a /24 of
10.77.0.0/16 of its own, chosen under a lock among those no other bed uses.

Needs root (``CAP_NET_ADMIN``) and ``ip``/``tc`` (iproute2): :func:`unavailable` says why
a process cannot make a bed (tests skip with that reason). Every method runs ``ip``/``tc``
and blocks until they are done; failures raise :class:`TestbedError`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from trimtab.errors import ConfigError
from trimtab.launch import tcprate
from trimtab.launch.netns import call_in
from trimtab.transport.hostid import process_running

__all__ = [
    "PREFIX",
    "BedInfo",
    "Host",
    "Testbed",
    "TestbedError",
    "list_beds",
    "remove_stale",
    "unavailable",
]

#: The prefix of every name a bed makes (namespaces, links, bridge).
PREFIX = "ttb"
#: The addresses every bed takes its /24 from.
SUPERNET = ipaddress.IPv4Network("10.77.0.0/16")
_LOCK = Path("/run/trimtab-testbed.lock")
_NS = re.compile(rf"^{PREFIX}(\d+)([a-z])-(\d+)$")
_LINK = re.compile(rf"^{PREFIX}(\d+)([a-z])(?:br|v\d+)$")
_SERIAL = itertools.count()
_TOOLS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
T = TypeVar("T")
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21  # ip netns add mounts the namespace under /run/netns


class TestbedError(ConfigError):
    """An ``ip`` or ``tc`` command failed, or the bed cannot be made here."""

    __test__ = False  # not a pytest test class


def _tool(name: str) -> str:
    found = shutil.which(name) or next(
        (f"{d}/{name}" for d in _TOOLS if os.access(f"{d}/{name}", os.X_OK)), None
    )
    if found is None:
        raise TestbedError(f"`{name}` (iproute2) is not installed: the test bed needs it")
    return found


def _run(argv: Sequence[str], check: bool = True) -> str:
    """Run an ``ip``/``tc`` command; its stdout. Blocks. Raises :class:`TestbedError`."""
    argv = [_tool(argv[0]), *argv[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and done.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why this process cannot make a bed (a sentence), or None if it can. Never raises."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    try:
        _tool("ip")
        _tool("tc")
    except TestbedError as exc:
        return str(exc)
    try:
        status = Path("/proc/self/status").read_text()
        cap = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M).group(1), 16)  # type: ignore[union-attr]
    except (OSError, AttributeError, ValueError):
        return "cannot read this process's capabilities"
    if not (cap >> _CAP_NET_ADMIN & 1 and cap >> _CAP_SYS_ADMIN & 1):
        return "making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return None


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of a bed.

    Attributes:
        index: its place in the bed (0, 1, ...).
        namespace: its network namespace (``ip netns exec NAMESPACE ...``).
        address: its address on the bed (``10.77.X.I``).
        link: the bridge side of its veth (in the machine's namespace); inside the
            namespace its end is ``eth0``.
    """

    index: int
    namespace: str
    address: str
    link: str

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this host: ``ip netns exec NAMESPACE command...``."""
        return [_tool("ip"), "netns", "exec", self.namespace, *command]

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run inside this host, on a thread of this process that joined its
        namespace (:func:`~trimtab.launch.netns.call_in`): what ``fn`` connects to is
        reached as from this host. Blocks until ``fn`` returns; raises what it raises,
        or :class:`~trimtab.launch.netns.NamespaceError`."""
        return call_in(self.namespace, fn)


@dataclasses.dataclass(frozen=True)
class BedInfo:
    """A bed found on this machine (:func:`list_beds`): its id, owner, hosts."""

    id: str
    owner: int
    alive: bool
    hosts: tuple[Host, ...]
    subnet: str


def _bed_id(owner: int) -> str:
    """A new bed id of ``owner``: its pid and a letter, a new one per bed of a process."""
    return f"{PREFIX}{owner}{chr(ord('a') + next(_SERIAL) % 26)}"


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line]


def _address_in(namespace: str) -> str | None:
    out = _run(["ip", "-n", namespace, "-o", "-4", "addr", "show", "dev", "eth0"], check=False)
    match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    return match.group(1) if match else None


def list_beds() -> list[BedInfo]:
    """Every bed on this machine, by owner. Blocks (runs ``ip``). Raises
    :class:`TestbedError` if ``ip`` fails."""
    found: dict[tuple[int, str], list[Host]] = {}
    for ns in _namespaces():
        match = _NS.match(ns)
        if match:
            owner, letter, index = int(match.group(1)), match.group(2), int(match.group(3))
            address = _address_in(ns) or ""
            link = f"{PREFIX}{owner}{letter}v{index}"
            found.setdefault((owner, letter), []).append(Host(index, ns, address, link))
    for link in _links():
        match = _LINK.match(link)
        if match:
            found.setdefault((int(match.group(1)), match.group(2)), [])
    beds = []
    for (owner, letter), hosts in sorted(found.items()):
        hosts.sort(key=lambda h: h.index)
        addresses = [h.address for h in hosts if h.address]
        subnet = str(ipaddress.ip_network(f"{addresses[0]}/24", strict=False)) if addresses else ""
        bed = f"{PREFIX}{owner}{letter}"
        beds.append(BedInfo(bed, owner, process_running(owner), tuple(hosts), subnet))
    return beds


def _links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"])
    return [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)", out, re.M)]


def _remove(bed: str) -> None:
    """Remove every namespace and link of the bed ``bed`` (its id). Never raises."""
    with contextlib.suppress(TestbedError):
        for ns in _namespaces():
            if ns.startswith(f"{bed}-") and _NS.match(ns):
                _run(["ip", "netns", "delete", ns], check=False)
    with contextlib.suppress(TestbedError):
        for link in _links():  # deleting a namespace deleted its veth pairs already
            match = _LINK.match(link)
            if match and f"{PREFIX}{match.group(1)}{match.group(2)}" == bed:
                _run(["ip", "link", "delete", link], check=False)


def remove_stale(everything: bool = False) -> list[str]:
    """Remove the beds whose owner process has gone (or every bed, ``everything``);
    the ids of those removed. Blocks. Raises :class:`TestbedError` if ``ip`` fails."""
    removed = []
    with _locked():
        for bed in list_beds():
            if everything or not bed.alive:
                _remove(bed.id)
                removed.append(bed.id)
    return removed


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The machine-wide lock under which beds are made and removed (a /24 is chosen
    and taken in one step)."""
    with open(_LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_subnet(owner: int) -> ipaddress.IPv4Network:
    """A /24 of :data:`SUPERNET` that no bed and no address of this machine uses,
    starting from one derived from ``owner``. Call under :func:`_locked`."""
    used = {b.subnet for b in list_beds() if b.subnet}
    for match in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", _run(["ip", "-o", "-4", "addr"])):
        used.add(str(ipaddress.ip_network(f"{match.group(1)}/24", strict=False)))
    subnets = list(SUPERNET.subnets(new_prefix=24))[1:-1]  # not .0.x nor .255.x
    start = owner % len(subnets)
    for i in range(len(subnets)):
        candidate = subnets[(start + i) % len(subnets)]
        if str(candidate) not in used:
            return candidate
    raise TestbedError(f"every /24 of {SUPERNET} is taken by another bed")


class Testbed:
    """``hosts`` network namespaces on one bridge, made by :meth:`up` and removed by
    :meth:`down` (idempotent; also at exit of this process, and by :func:`remove_stale`
    once this process is gone). Not thread-safe.

    Use as a context manager: ``with Testbed(4) as bed: bed.hosts[0].argv([...])``.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, hosts: int, owner: int | None = None) -> None:
        if not 1 <= hosts <= 250:
            raise ConfigError(f"a bed has 1 to 250 hosts, not {hosts}")
        self.owner = os.getpid() if owner is None else owner
        self.id = _bed_id(self.owner)
        self.bridge = f"{self.id}br"
        self.size = hosts
        self.hosts: list[Host] = []
        self.subnet: ipaddress.IPv4Network | None = None

    def __enter__(self) -> Testbed:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Make the bed. Blocks (about 0.1 s a host). Raises :class:`TestbedError` (the
        bed is removed again) if this process may not, or a bed of this id exists."""
        why = unavailable()
        if why is not None:
            raise TestbedError(why)
        with _locked():
            if any(b.id == self.id for b in list_beds()):
                raise TestbedError(f"bed {self.id} exists already (trimtab testbed down)")
            self.subnet = _free_subnet(self.owner)
            atexit.register(self.down)
            try:
                self._make()
            except BaseException:
                _remove(self.id)
                self.hosts = []
                raise

    def _make(self) -> None:
        assert self.subnet is not None
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i in range(self.size):
            ns, link, inner = f"{self.id}-{i}", f"{self.id}v{i}", f"{self.id}e{i}"
            address = str(self.subnet.network_address + i + 1)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", link, "type", "veth", "peer", "name", inner])
            _run(["ip", "link", "set", link, "master", self.bridge, "up"])
            _run(["ip", "link", "set", inner, "netns", ns])
            _run(["ip", "-n", ns, "link", "set", inner, "name", "eth0"])
            _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self.hosts.append(Host(i, ns, address, link))

    def down(self) -> None:
        """Remove the bed (its namespaces, links and bridge). Idempotent; never raises."""
        with contextlib.suppress(OSError, TestbedError), _locked():
            _remove(self.id)
        self.hosts = []
        atexit.unregister(self.down)

    def shape(
        self,
        host: int,
        rate_mbit: float = 0.0,
        delay_ms: float = 0.0,
        ingress: bool = True,
    ) -> None:
        """Shape ``host``'s link: at most ``rate_mbit`` Mbit/s (``tbf``; 0: unlimited)
        and ``delay_ms`` one way (``netem``; 0: none), on what it sends and, with
        ``ingress``, on what it receives (the bridge side of its veth). Replaces any
        earlier shaping; both 0 removes it. Blocks. Raises :class:`TestbedError`."""
        h = self.hosts[host]
        sides = [["ip", "netns", "exec", h.namespace, "tc"], ["tc"]]
        devices = ["eth0", h.link]
        for side, dev in list(zip(sides, devices, strict=True))[: 2 if ingress else 1]:
            _run([*side, "qdisc", "del", "dev", dev, "root"], check=False)
            if rate_mbit <= 0 and delay_ms <= 0:
                continue
            tbf = _tbf(rate_mbit)
            if delay_ms > 0 and not _has_netem(side, dev):
                raise TestbedError(
                    "this kernel has no netem (sch_netem): the bed cannot add latency here"
                )
            if delay_ms > 0:
                _run(
                    [
                        *side,
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "handle",
                        "1:",
                        "netem",
                        "delay",
                        f"{delay_ms}ms",
                        "limit",
                        "100000",
                    ]
                )
                if tbf:
                    _run(
                        [*side, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf]
                    )
            else:
                _run([*side, "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf])

    def exec_argv(self, host: int, command: Sequence[str]) -> list[str]:
        """``command`` run inside host ``host`` (see :meth:`Host.argv`)."""
        return self.hosts[host].argv(command)

    def tcp_rate(self, sender: int, receiver: int, seconds: float = 1.0) -> float:
        """Bytes per second of one TCP stream from host ``sender`` to host ``receiver``
        (:meth:`tcp_stream`). Blocks as it does; raises :class:`TestbedError` if the
        measure fails."""
        return self.tcp_stream(sender, receiver, seconds).bytes_per_s

    def tcp_stream(self, sender: int, receiver: int, seconds: float = 1.0) -> tcprate.Stream:
        """One TCP stream from host ``sender`` to host ``receiver`` (Python sockets,
        :mod:`~trimtab.launch.tcprate`), sent for ``seconds``: its rate, and the cores of
        the machine busy while it ran. Blocks that long and more. Raises
        :class:`TestbedError` if the measure fails."""
        to = self.hosts[receiver]
        try:
            return tcprate.measure_stream(
                self.hosts[sender].argv([]), to.argv([]), to.address, seconds
            )
        except tcprate.RateError as exc:
            raise TestbedError(str(exc)) from exc


def _has_netem(side: list[str], dev: str) -> bool:
    """Whether ``tc`` can make a netem qdisc on ``dev`` (a module some kernels lack)."""
    try:
        _run([*side, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"])
    except TestbedError:
        return False
    _run([*side, "qdisc", "del", "dev", dev, "root"], check=False)
    return True


def _tbf(rate_mbit: float) -> list[str]:
    """``tbf``'s arguments for ``rate_mbit`` (none for 0). The bucket holds a GSO
    super-packet (64 KiB, or the link would drop it) and 2 ms of the rate (the kernel's
    timers need that much to reach the rate), no more: a link never runs faster than
    its rate, as a NIC cannot (a bucket of 256 KiB let a quarter-rate server send each
    256 KiB chunk at once after a pause, and look twice as fast lightly loaded as
    busy); packets wait at most 50 ms."""
    if rate_mbit <= 0:
        return []
    burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 * 0.002))
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]
