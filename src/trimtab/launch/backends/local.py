"""The local backend: each role a process of this machine, in a session of its own.

A process is started with ``start_new_session`` (so that stopping it stops whatever it
started, e.g. a data loader's workers) and ``PR_SET_PDEATHSIG`` (so that a launcher
killed outright takes its processes with it).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence

from trimtab.launch.backends.base import Backend, RoleHandle, RoleSpec
from trimtab.launch.procs import die_with_parent

__all__ = ["LocalBackend", "LocalRole", "popen_role"]


class LocalRole(RoleHandle):
    """A role that is a process of this machine (:attr:`popen`)."""

    def __init__(self, popen: subprocess.Popen[bytes], node: str | None = None) -> None:
        self.popen = popen
        self._node = node

    def node(self) -> str | None:
        return self._node

    @property
    def pid(self) -> int:
        """Its process id (and its process group's)."""
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int, group: bool = False) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.popen.pid, sig)
            elif self.popen.poll() is None:
                self.popen.send_signal(sig)

    def lines(self) -> Iterator[bytes]:
        assert self.popen.stdout is not None
        yield from iter(self.popen.stdout.readline, b"")

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def popen_role(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: str | None = None,
    with_parent: Callable[[], None] = die_with_parent,
) -> LocalRole:
    """``argv`` started as a role's process: its output in one pipe, no input, its own
    session, stopped with the thread that started it (``with_parent``, run in the child
    before exec). Blocks until it is started. Raises :class:`OSError` if it cannot be."""
    popen = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=with_parent,
    )
    return LocalRole(popen)


class LocalBackend(Backend):
    """Every role a process of this machine, bound on ``host`` (loopback by default)."""

    name = "local"

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host

    def start(self, role: RoleSpec) -> RoleHandle:
        return popen_role(role.with_host(self.host), dict(role.env))
