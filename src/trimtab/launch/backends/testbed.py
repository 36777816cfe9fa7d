"""The test bed's backend: each role a process in a host of a bed (a network namespace
of this machine, :mod:`trimtab.launch.testbed`), where a layout says
(:mod:`trimtab.launch.hosts`), bound on that host's address."""

from __future__ import annotations

from trimtab.launch.backends.base import Backend, RoleHandle, RoleSpec
from trimtab.launch.backends.local import popen_role
from trimtab.launch.hosts import Layout, place
from trimtab.launch.testbed import Host, Testbed

__all__ = ["TestbedBackend"]


class TestbedBackend(Backend):
    """Roles on ``bed`` (a bed that is up), laid out by ``layout`` (default:
    :func:`~trimtab.launch.hosts.place`'s rule for ``servers`` and ``workers``); or, with
    ``hosts`` instead of a bed, on a bed of that many hosts made by :meth:`up` and
    removed by :meth:`down`."""

    __test__ = False  # not a pytest test class
    name = "testbed"

    def __init__(
        self,
        servers: int,
        workers: int,
        bed: Testbed | None = None,
        hosts: int = 0,
        layout: Layout | None = None,
    ) -> None:
        if bed is None and hosts < 1:
            raise ValueError("a test bed backend needs a bed or a number of hosts")
        self.bed = bed
        self._hosts = hosts
        self._own: Testbed | None = None
        self._shape = (servers, workers)
        self.layout = layout or Layout()
        self._laid_out = layout is not None

    def up(self) -> None:
        if self.bed is None:
            self._own = Testbed(self._hosts)
            self._own.up()
            self.bed = self._own
        if not self._laid_out:
            self.layout = place(self.bed.hosts, *self._shape)

    def down(self) -> None:
        if self._own is not None:
            self._own.down()
            self._own = None

    def where(self) -> str | None:
        assert self.bed is not None
        hosts = ", ".join(f"{h.namespace} {h.address}" for h in self.bed.hosts)
        return f"on the test bed {self.bed.id}: {hosts}"

    def host_of(self, role: RoleSpec) -> Host | None:
        """The bed host ``role`` runs on."""
        if role.kind == "coordinator":
            return self.layout.coordinator
        if role.kind == "server":
            return self.layout.server(role.index)
        return self.layout.worker(role.index)

    def start(self, role: RoleSpec) -> RoleHandle:
        host = self.host_of(role)
        argv = role.with_host("127.0.0.1" if host is None else host.address)
        return popen_role(self.layout.run(host, argv), dict(role.env))

    def local(self, rank: int, workers: int) -> tuple[int, int, int, int]:
        return self.layout.local(rank, workers)

    def near_coordinator(self) -> Host | None:
        return self.layout.coordinator
