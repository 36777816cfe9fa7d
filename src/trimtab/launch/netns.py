"""Running a function inside another network namespace, from this process.

The launcher talks to a job's coordinator (to poll for the servers and workers it asks
for, :meth:`Job._grow`); on a test bed the coordinator listens on a host's address,
which the machine's own namespace cannot reach (the bed's bridge has no address). A
thread may join another network namespace on its own (``setns(2)`` acts on the calling
thread only), and what it creates afterwards lives there: its sockets, and the threads it
starts, such as the I/O thread of a ZeroMQ context it makes. So :func:`call_in` runs a
function on a fresh thread that first joins the namespace; the rest of the process stays
where it was.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["NamespaceError", "call_in"]

#: Where ``ip netns add NAME`` mounts a namespace.
NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000

T = TypeVar("T")


class NamespaceError(RuntimeError):
    """The namespace could not be joined (gone, or no CAP_SYS_ADMIN)."""


def call_in(namespace: str, fn: Callable[[], T]) -> T:
    """``fn()`` run on a thread of its own inside network namespace ``namespace`` (an
    ``ip netns`` name); its result. Blocks until ``fn`` returns. Raises what ``fn``
    raises, or :class:`NamespaceError` if the namespace cannot be joined."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            _join(namespace)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=f"trimtab-netns-{namespace}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _join(namespace: str) -> None:
    """Move the calling thread into ``namespace``. Raises :class:`NamespaceError`."""
    path = NETNS_DIR / namespace
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NamespaceError(f"no network namespace {namespace!r} ({exc.strerror})") from None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NamespaceError(
                f"cannot join network namespace {namespace!r}: {os.strerror(err)} "
                "(needs CAP_SYS_ADMIN, as the bed's root does)"
            )
    finally:
        os.close(fd)
