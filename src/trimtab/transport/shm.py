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
``TRIMTAB_SHM=0`` turns it off: :func:`turned_off` reads it, at the edges only (``init()``,
the transport's constructor); everything below takes the setting as an argument.

A worker's side is a :class:`SlotMap` (its arena, the slot of each chunk, which servers
share it); a server maps the workers' arenas with :meth:`Arena.attach`.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from trimtab.transport.hostid import host_id, is_own_address, process_running

log = logging.getLogger("trimtab.shm")

#: Set to ``0`` to send every byte through the sockets.
ENV = "TRIMTAB_SHM"
SHM_DIR = Path("/dev/shm")
_NAME = re.compile(r"trimtab-[A-Za-z0-9_.-]+")
#: The end of an arena's name: ``-<owner pid>-<8 hex digits>``.
_OWNER = re.compile(r"-(\d+)-[0-9a-f]{8}$")


def turned_off(environ: Mapping[str, str]) -> bool:
    """Whether ``TRIMTAB_SHM=0`` in ``environ`` (an edge passes ``os.environ``) asks for
    everything through TCP, as between machines (no shared memory, no local lane)."""
    return environ.get(ENV, "1") == "0"


def is_local(address: str) -> bool:
    """Whether a ``tcp://HOST:PORT`` address is of this process's network stack (its
    loopback, or an address of its interfaces): a peer there is most likely on this host
    and shares its ``/dev/shm``. Only a guess, to avoid trying where it cannot work:
    a server checks the worker's host id (:mod:`~trimtab.transport.hostid`) before it
    maps an arena, and answers ``no_shm`` to a worker of another host."""
    host = address.removeprefix("tcp://").rsplit(":", 1)[0]
    return host == "localhost" or is_own_address(host)


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
        """A new arena for this process, named after it (:func:`owner_of`); first
        removes the arenas of processes that are gone (:func:`remove_stale_arenas`).
        Raises ``OSError`` if ``/dev/shm`` cannot hold ``size`` bytes."""
        remove_stale_arenas()
        name = f"{job_prefix(job)}{label}-{host_id()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
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


class SlotMap:
    """A worker's shared memory: one arena, a slot per chunk too big to ride inside a
    header (the chunk's bytes, cache-line aligned), and which servers share it.

    Made by :meth:`create`; with no arena (shared memory off, nothing big enough, or no
    room in ``/dev/shm``) every method answers "send bytes". Not thread-safe: the
    training thread uses it. No method blocks; only :meth:`refused` raises (see there).
    """

    def __init__(
        self, arena: Arena | None, slots: dict[int, tuple[int, int]], min_bytes: int
    ) -> None:
        self.arena = arena
        #: chunk id -> (offset, capacity) in :attr:`arena`; read on the push path.
        self.slots = slots
        self._min = min_bytes
        self._local: dict[str, bool] = {}  # server address -> shares our arena

    @classmethod
    def create(
        cls,
        job: str,
        label: str,
        sizes: Iterable[tuple[int, int]],
        *,
        min_bytes: int,
        enabled: bool,
    ) -> SlotMap:
        """A slot for each ``(chunk id, bytes)`` of ``sizes`` over ``min_bytes`` (what
        fits in a header rides there), in one new arena named after ``job`` and
        ``label``. ``enabled`` is the job's setting (``TRIMTAB_SHM``, read by the
        caller). Does not block; never raises: without room in ``/dev/shm`` it logs
        why and returns a map without an arena."""
        slots: dict[int, tuple[int, int]] = {}
        if not enabled:
            return cls(None, slots, min_bytes)
        total = 0
        for chunk, nbytes in sizes:
            if nbytes > min_bytes:
                slots[chunk] = (total, nbytes)
                total += -(-nbytes // 64) * 64  # cache-line aligned
        if not slots:
            return cls(None, {}, min_bytes)
        try:
            arena = Arena.create(job, label, total)
        except (OSError, ValueError) as exc:
            log.info("trimtab: no shared memory for pushes (%s); using the sockets", exc)
            return cls(None, {}, min_bytes)
        return cls(arena, slots, min_bytes)

    def shares(self, address: str) -> bool:
        """Whether pushes to the server at ``address`` go through the arena."""
        local = self._local.get(address)
        if local is None:
            local = self._local[address] = self.arena is not None and is_local(address)
        return local

    def write(
        self, slot: tuple[int, int], address: str, data: memoryview
    ) -> list[str | int] | None:
        """Copy a push's gradient ``data`` into its chunk's ``slot`` (from
        :attr:`slots`) if it goes to ``address`` through the arena; return the header's
        ``sm`` field then, else None (send the bytes inline). The chunk's previous reply
        was read before this push, so nothing reads the slot meanwhile."""
        arena = self.arena
        nbytes = data.nbytes
        if arena is None or not self._min < nbytes <= slot[1]:
            return None
        local = self._local.get(address)  # shares(), inline: this runs per chunk
        if local is None:
            local = self._local[address] = is_local(address)
        if not local:
            return None
        arena.buf[slot[0] : slot[0] + nbytes] = data
        return [arena.name, slot[0], slot[1]]

    def value(self, chunk: int, nbytes: int) -> memoryview | None:
        """The ``nbytes`` a server wrote into ``chunk``'s slot as its reply, or None if
        the chunk has no slot or they would not fit it (the server broke the protocol)."""
        slot = self.slots.get(chunk)
        if self.arena is None or slot is None or not 0 < nbytes <= slot[1]:
            return None
        return self.arena.view(slot[0], nbytes)

    def refused(self, address: str, offset: int, nbytes: int) -> memoryview:
        """The server at ``address`` cannot map the arena (it answered ``no_shm``): it
        gets bytes from now on; return the refused push's ``nbytes`` at ``offset`` to
        resend them. Raises ``ValueError`` for bytes outside the arena."""
        self._local[address] = False
        if self.arena is None:
            raise ValueError("no arena: nothing was pushed through shared memory")
        return self.arena.view(offset, nbytes)

    def close(self) -> None:
        """Remove the arena (the job is over for this worker). Idempotent."""
        if self.arena is not None:
            self.arena.close()
            self.arena = None
            self.slots = {}


def owner_of(name: str) -> int | None:
    """The process id of the process that made arena ``name``, or None for a name that
    does not say it. Pure."""
    match = _OWNER.search(name) if _NAME.fullmatch(name) else None
    return int(match.group(1)) if match else None


def remove_stale_arenas(shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove the arenas whose owner process is gone (a worker killed outright, or a
    launcher's: SIGKILL leaves no chance to clean up); returns their names. Each new
    arena and each launcher start do it. An arena of a live process, or of another
    user's, stays. Never raises; never blocks (one directory listing)."""
    removed = []
    with contextlib.suppress(OSError):
        for path in shm_dir.glob("trimtab-*"):
            pid = owner_of(path.name)
            if pid is not None and pid != os.getpid() and not process_running(pid):
                with contextlib.suppress(OSError):  # another process removed it first
                    path.unlink()
                    removed.append(path.name)
    return removed


def remove_own_arenas(shm_dir: Path = SHM_DIR) -> None:
    """Remove every arena this process made (it is about to die of a signal: its
    atexit handlers will not run). Never raises."""
    pid = os.getpid()
    with contextlib.suppress(OSError):
        for path in shm_dir.glob(f"trimtab-*-{pid}-*"):
            if owner_of(path.name) == pid:
                path.unlink(missing_ok=True)


def remove_job_arenas(job: str) -> None:
    """Remove what a job's processes left in ``/dev/shm`` (a worker killed outright
    cannot remove its arena). Never raises."""
    with contextlib.suppress(OSError):
        for path in SHM_DIR.glob(job_prefix(job) + "*"):
            path.unlink(missing_ok=True)
