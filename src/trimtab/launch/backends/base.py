"""The launcher's one interface to whatever runs a job's processes.

A :class:`Backend` starts a role (:class:`RoleSpec`: its command line, its environment,
which carries the path of the job's secret, never the secret) somewhere, and hands back
a :class:`RoleHandle` to watch it (:meth:`RoleHandle.poll`, its output lines) and stop it
(:meth:`RoleHandle.signal`). The launcher (:class:`~trimtab.launch.job.Job`) does the
rest once for every backend: the order of start-up, supervision, the recovery of a lost
member, scaling, ``--fault`` injection, the end. The roles never learn which backend
started them: each is the same ``trimtab coordinator``/``trimtab server`` command, or
the user's worker command, with the same variables.

A backend places each role: the address it binds is :data:`HOST` in its command line,
which the backend replaces by the address of the host the role landed on (the loopback,
a test bed's host, a Ray node). A role the engine loses (a dead Ray actor, a node gone)
reads as a process killed by ``SIGKILL``: a lost member like any other.
"""

from __future__ import annotations

import abc
import dataclasses
import signal
import time
from collections.abc import Iterator, Mapping, Sequence

from trimtab.launch.testbed import Host

__all__ = ["HOST", "LOST_STATUS", "Backend", "RoleHandle", "RoleSpec"]

#: In a role's command line: the address of the host the backend puts it on.
HOST = "{trimtab-host}"

#: The status of a role its engine lost (its actor or node died): as a ``SIGKILL``.
LOST_STATUS = -int(signal.SIGKILL)

#: The kinds of role.
KINDS = ("coordinator", "server", "worker")


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """One role of a job to start.

    Attributes:
        kind: ``coordinator``, ``server`` or ``worker``.
        index: a server's number in start order, a worker's rank (0 for the coordinator).
        argv: its command line; :data:`HOST` in it becomes the address it binds.
        env: its whole environment (as the launcher's host would give it).
        late: started while the job runs (a server the coordinator asked for, or one
            replacing a lost one; a joining worker), not with the job: a backend that
            emulates hosts on one machine may start it apart (the test bed's).
    """

    kind: str
    index: int
    argv: Sequence[str]
    env: Mapping[str, str]
    late: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a role is one of {KINDS}, not {self.kind!r}")

    @property
    def source(self) -> str:
        """Its name in the job's output: ``coordinator``, ``server 1``, ``worker 0``."""
        return "coordinator" if self.kind == "coordinator" else f"{self.kind} {self.index}"

    def with_host(self, address: str) -> list[str]:
        """:attr:`argv` with :data:`HOST` replaced by ``address``."""
        return [address if a == HOST else a for a in self.argv]


class RoleHandle(abc.ABC):
    """A started role: watch it, stop it. ``poll`` and ``signal`` are thread-safe; one
    thread reads :meth:`lines`."""

    @abc.abstractmethod
    def poll(self) -> int | None:
        """Its exit status once it ended (negative: the signal that killed it;
        :data:`LOST_STATUS` for one its engine lost), else None. Never blocks long."""

    @abc.abstractmethod
    def signal(self, sig: int, group: bool = False) -> None:
        """Send ``sig`` to the role (with ``group``: and to every process it started,
        e.g. a data loader's). Never raises for a role that has ended."""

    @abc.abstractmethod
    def lines(self) -> Iterator[bytes]:
        """Its output (stdout and stderr), line by line, until it ends. Blocks between
        lines."""

    def node(self) -> str | None:
        """The address of the node it runs on, where its backend chose it (a Ray node,
        a Slurm node), else None. May block until the engine started it (the launcher
        asks from the thread that reads the role's output)."""
        return None

    @property
    def returncode(self) -> int | None:
        """:meth:`poll`'s last answer."""
        return self.poll()

    def terminate(self) -> None:
        """``SIGTERM`` to the role alone. Never raises."""
        self.signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until it ends (or ``timeout`` seconds pass: then None); its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
        return code


class Backend(abc.ABC):
    """Where a job's roles run. :meth:`up` before the first :meth:`start`, :meth:`down`
    after the last role ended (idempotent). Not thread-safe: the launcher calls it from
    one thread."""

    #: Its name (``trimtab run --backend NAME``).
    name = ""

    def up(self) -> None:  # noqa: B027 - most backends have nothing to make
        """Make or reach what the roles run on. Blocks. Raises
        :class:`~trimtab.errors.ConfigError` if it cannot."""

    def down(self) -> None:  # noqa: B027
        """Give back what :meth:`up` made. Idempotent; never raises."""

    def where(self) -> str | None:
        """A line for the job's output saying where its roles run, or None."""
        return None

    @abc.abstractmethod
    def start(self, role: RoleSpec) -> RoleHandle:
        """Start ``role``. Blocks until it is started (not until it is ready). Raises
        :class:`~trimtab.errors.ConfigError` if it cannot be."""

    def secret_parent(self) -> str | None:
        """Where the job's private secret directory is made: a directory every node
        of the backend sees (None: this machine's temporary directory). Never
        blocks."""
        return None

    def local(self, rank: int, workers: int) -> tuple[int, int, int, int]:
        """Worker ``rank``'s (local rank, local size, cross rank, cross size) in a job
        of ``workers``, where the backend knows it before it starts them (else: one
        machine). Never blocks."""
        return rank, workers, 0, 1

    def near_coordinator(self) -> Host | None:
        """The host to ask the coordinator from (a test bed's host), or None for this
        process's own network. Never blocks."""
        return None
