"""The server's end of shared memory: a push's gradient read from the worker's arena
slot, and the reply's value written back into it (see :mod:`trimtab.transport.shm`)."""

from __future__ import annotations

from collections.abc import Sequence

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ProtocolError
from trimtab.protocol.headers import PushHeader
from trimtab.protocol.messages import ErrorCode
from trimtab.transport.hostid import host_id
from trimtab.transport.shm import Arena, job_prefix

#: Arenas one server maps at most (a worker has one; a few more are slack).
MAX_ARENAS = 4096


class Slot:
    """Where a push's gradient was in a worker's shared memory; its reply's value goes
    there too. Immutable by convention."""

    __slots__ = ("arena", "capacity", "offset")

    def __init__(self, arena: Arena, offset: int, capacity: int) -> None:
        self.arena = arena
        self.offset = offset
        self.capacity = capacity


class SharedArenas:
    """The workers' arenas one server has mapped, on first use. Not thread-safe: the
    server's loop owns it."""

    def __init__(self, job: str) -> None:
        self._prefix = job_prefix(job)
        self._arenas: dict[str, Arena] = {}

    def read(
        self, header: PushHeader, frames: Sequence[memoryview], server: int
    ) -> tuple[Slot, list[memoryview]]:
        """A push whose gradient is in the worker's shared memory (its ``sm``, whose
        shape :func:`~trimtab.protocol.headers.read_push` checked): its slot, and the
        gradient's bytes there. Never blocks. Raises :class:`ProtocolError`: MALFORMED
        for a tensor frame besides the slot, an ``sm`` of nil, another job's arena, a
        push with no ``dt`` and ``n`` (one with ``z``) or a slot outside the arena;
        NO_SHM if the arena is of another host or cannot be mapped here (``server``
        names this server in the message)."""
        sm = header["sm"]
        if frames or sm is None:  # (read_push passes a nil sm as if it were absent)
            raise ProtocolError(
                ErrorCode.MALFORMED.value,
                "'sm' must be [arena, offset, capacity], with no tensor frame",
            )
        name, offset, capacity = sm
        # Only the pushing worker's own arena (``SlotMap.create`` names it after its
        # rank; the rank is the one its credential was checked for): no worker makes
        # a server read or write another's shared memory.
        own = f"{self._prefix}w{header['r']}-"
        if not name.startswith(own):
            raise ProtocolError(
                ErrorCode.FORBIDDEN.value,
                f"{name!r} is not worker {header['r']}'s arena of this job",
            )
        arena = self._arenas.get(name)
        if arena is None:
            # The arena is named after the worker's host: one of another host (another
            # network namespace of this machine, whose /dev/shm may be this one) is not
            # mapped, even where it could be: between hosts, bytes go over the network.
            if name[len(own) :].split("-", 1)[0] != host_id():
                raise ProtocolError(
                    ErrorCode.NO_SHM.value,
                    f"server {server} is not on worker {header['r']}'s host; send it the bytes",
                )
            if len(self._arenas) >= MAX_ARENAS:
                raise ProtocolError(
                    ErrorCode.NO_SHM.value,
                    f"server {server} maps {len(self._arenas)} arenas already; send it the bytes",
                )
            try:
                arena = Arena.attach(name)
            except (OSError, ValueError) as exc:
                raise ProtocolError(
                    ErrorCode.NO_SHM.value,
                    f"server {server} cannot map shared memory {name!r} ({exc}); send it the bytes",
                ) from None
            self._arenas[name] = arena
        numel, dtype = header.get("n"), header.get("dt")
        if numel is None or dtype is None:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, "a push naming a slot needs its 'dt' and 'n'"
            )
        nbytes = numel * DTYPE_SIZES.get(dtype, 0)
        if nbytes > capacity:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"{nbytes} bytes do not fit a slot of {capacity}"
            )
        try:
            arena.view(offset, capacity)
            data = arena.view(offset, nbytes)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.MALFORMED.value, str(exc)) from None
        return Slot(arena, offset, capacity), [data]

    def close(self) -> None:
        """Unmap every arena (the workers remove them). Idempotent; never raises."""
        for arena in self._arenas.values():
            arena.close()
        self._arenas.clear()
