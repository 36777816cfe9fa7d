"""The test bed's backend: each role a process in a host of a bed (a network namespace
of this machine, :mod:`trimtab.launch.testbed`), where a layout says
(:mod:`trimtab.launch.hosts`), bound on that host's address.

The bed's hosts share this machine's cores, where a cluster's machines have their own.
So that a server started while the job runs (PSLD's scale-out, ``trimtab scale``, a
lost one's replacement) does not take the job's cores while it imports and registers,
as a joiner on a machine of its own would not, it starts at the lowest priority and
takes the job's back once it serves (:mod:`trimtab.launch.niceness`); where this process
could not raise it back (no ``CAP_SYS_NICE``), it starts at normal priority, as the
job's output says. The job's first roles all start before its first step; a worker
joining later (``--fault worker:+N@S``) starts at normal priority (its process is the
user's command, which restores nothing).
"""

from __future__ import annotations

import os

from trimtab.launch import niceness
from trimtab.launch.backends.base import Backend, RoleHandle, RoleSpec
from trimtab.launch.backends.local import popen_role
from trimtab.launch.hosts import Layout, place
from trimtab.launch.procs import die_with_parent
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
        #: The nice value of this process, which a late server takes back once it
        #: serves, and why it cannot (None: it can).
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        self.cannot_lower = niceness.why_not(self.nice)

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
        if self.cannot_lower is None:
            late = f"servers started later begin at nice {niceness.START_NICE} until they serve"
        else:
            late = f"servers started later begin at normal priority ({self.cannot_lower})"
        return f"on the test bed {self.bed.id}: {hosts}; {late}"

    def host_of(self, role: RoleSpec) -> Host | None:
        """The bed host ``role`` runs on."""
        if role.kind == "coordinator":
            return self.layout.coordinator
        if role.kind == "server":
            return self.layout.server(role.index)
        return self.layout.worker(role.index)

    def start(self, role: RoleSpec) -> RoleHandle:
        host = self.host_of(role)
        argv = self.layout.run(host, role.with_host("127.0.0.1" if host is None else host.address))
        env = dict(role.env)
        if not self.starts_low(role):
            return popen_role(argv, env)
        env[niceness.ENV] = str(self.nice)  # ``trimtab server`` takes it back once serving
        return popen_role(argv, env, with_parent=_low_with_parent)

    def starts_low(self, role: RoleSpec) -> bool:
        """Whether ``role`` starts at the lowest priority: a late server, where this
        process could raise it back (see the module). Never blocks."""
        return role.kind == "server" and role.late and self.cannot_lower is None

    def local(self, rank: int, workers: int) -> tuple[int, int, int, int]:
        return self.layout.local(rank, workers)

    def near_coordinator(self) -> Host | None:
        return self.layout.coordinator


def _low_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """In a late server's child before exec: stopped with the launcher, and at the
    lowest priority (:func:`~trimtab.launch.niceness.lower`)."""
    die_with_parent()
    niceness.lower()
