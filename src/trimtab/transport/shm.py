"""Shared memory between a worker and the servers on its machine.

Over loopback TCP every byte of a push and of its reply is copied by the kernel twice (into
the socket, out of it) and handed through ZeroMQ's I/O threads: that was most of the CPU
time of a large step (BENCHMARKS.md, profile). A worker whose servers are on its machine
instead keeps one **arena** in ``/dev/shm``, a slot per chunk (the chunk's bytes in the
parameter's dtype). A push copies the gradient into the chunk's slot and sends only its
header, naming the slot (``sm``: arena, offset, capacity); the server reads the gradient
from there and, when the chunk's update is done, writes the new value into the same slot
(the worker's gradient was consumed on arrival) and replies with a header alone.

This is safe because a worker has at most one push of a chunk in flight (it waits for a
chunk's reply before pushing it again) and servers consume a push's gradient as it
arrives. A server that cannot open the arena (another machine, another ``/dev/shm``)
answers ``no_shm`` and the worker sends that server bytes from then on.
``TRIMTAB_SHM=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import mmap
import os
import re
import uuid
from pathlib import Path

log = logging.getLogger("trimtab.shm")

#: Set to ``0`` to send every byte through the sockets.
ENV = "TRIMTAB_SHM"
SHM_DIR = Path("/dev/shm")
_NAME = re.compile(r"trimtab-[A-Za-z0-9_.-]+")


def turned_off() -> bool:
    """Whether ``TRIMTAB_SHM=0`` asks for everything through TCP, as between machines
    (no shared memory, no local lane)."""
    return os.environ.get(ENV, "1") == "0"


def enabled() -> bool:
    """Whether workers may use shared memory (``TRIMTAB_SHM`` and ``/dev/shm``)."""
    return not turned_off() and SHM_DIR.is_dir()


def is_local(address: str) -> bool:
    """Whether a ``tcp://HOST:PORT`` address is on this machine's loopback (where a server
    most likely shares this machine's ``/dev/shm``; a server that does not says so)."""
    host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def job_prefix(job: str) -> str:
    """The name prefix of every arena of ``job`` (the launcher removes what is left)."""
    return f"trimtab-{job}-"


class Arena:
    """A file in ``/dev/shm`` mapped into this process.

    ``Arena.create`` makes one of ``size`` bytes, its memory reserved up front (so that a
    full ``/dev/shm`` fails here with ``OSError``, not later with SIGBUS on a write);
    ``Arena.attach`` maps an existing one. Neither blocks.
    """

    def __init__(self, name: str, buf: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.size = len(buf)
        self._mmap = buf
        self.buf = memoryview(buf)
        self._owner = owner

    @classmethod
    def create(cls, job: str, label: str, size: int) -> Arena:
        """A new arena for this process. Raises ``OSError`` if ``/dev/shm`` cannot hold
        ``size`` bytes."""
        name = f"{job_prefix(job)}{label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(size, 1))
            buf = mmap.mmap(fd, max(size, 1))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return cls(name, buf, owner=True)

    @classmethod
    def attach(cls, name: str) -> Arena:
        """Map another process's arena. Raises ``ValueError`` for a name that is not an
        arena's, ``OSError`` if it cannot be opened here."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not the name of a trimtab arena")
        fd = os.open(SHM_DIR / name, os.O_RDWR)
        try:
            buf = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return cls(name, buf, owner=False)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Bytes ``offset`` to ``offset + nbytes``. Raises ``ValueError`` out of range."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(
                f"bytes {offset}..{offset + nbytes} are outside arena {self.name} "
                f"({self.size} bytes)"
            )
        return self.buf[offset : offset + nbytes]

    def close(self) -> None:
        """Unmap (and, in the process that made it, remove) the arena. Idempotent; views
        still referenced keep the mapping until they go."""
        if self._owner:
            self._owner = False
            (SHM_DIR / self.name).unlink(missing_ok=True)
        with contextlib.suppress(BufferError):  # a view is still out there: GC unmaps
            self.buf.release()
            self._mmap.close()


def remove_job_arenas(job: str) -> None:
    """Remove what a job's processes left in ``/dev/shm`` (a worker killed outright
    cannot remove its arena). Never raises."""
    with contextlib.suppress(OSError):
        for path in SHM_DIR.glob(job_prefix(job) + "*"):
            path.unlink(missing_ok=True)
