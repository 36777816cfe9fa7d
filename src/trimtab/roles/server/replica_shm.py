"""A REPLICATE's bytes through shared memory, between a primary and a backup on one
machine (as a worker's pushes go, :mod:`trimtab.transport.shm`).

Through the sockets each replicated chunk costs a copy into the kernel and one out, and
with the job's key a MAC over every byte at each end. Instead the primary keeps, per
chunk it replicates, two arenas in ``/dev/shm`` (named after the job and the server,
``s<index>``), copies the chunk's value and state tensors into one of them, one after
the other, and sends a REPLICATE carrying only its header, with ``sm = [arena, 0,
bytes]``. The backup maps the arena (only the sender's own: the name says whose),
checks it, and acknowledges *without copying*: its copy of the chunk is those bytes,
read out only if it is ever promoted. So replicating a round costs one copy, not two.

The two arenas take turns: the primary writes the one its backup does not hold (the
other than the last acknowledged), and only while no REPLICATE of the chunk is in
flight (its next round needs its values, released only by the acknowledgement; a chunk
with one in flight anyway goes through the sockets). Where it cannot know which one the
backup holds (a replication dropped unacknowledged by a new map), it makes new arenas
(:meth:`ReplicaArenas.drop`); the backup's mapping of the old ones stays valid. A
handover (:mod:`.handover`) uses one arena per chunk: its receiver copies out before it
acknowledges.

An arena of a server killed outright stays until its job's launcher removes the job's
arenas (:func:`~trimtab.transport.shm.remove_job_arenas`); a backup's mapping outlives
its removal, so a dead primary's last round is still there to promote.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ProtocolError
from trimtab.protocol.messages import ErrorCode
from trimtab.protocol.replica import ReplicateHeader
from trimtab.transport import Frame
from trimtab.transport.shm import Arena, job_prefix

log = logging.getLogger("trimtab.server")

#: Arenas a backup maps at most: one per chunk it backs up, per primary.
MAX_ARENAS = 1 << 16


def _nbytes(frame: Frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


class ReplicaArenas:
    """A primary's arenas, per chunk it replicates (or hands over) and slot, and a
    backup's mapped arenas of its primaries, by the chunk they carry. Not thread-safe:
    the server's loop owns it. Nothing blocks.

    Args:
        job: the job id (the arenas' prefix).
        enabled: whether shared memory may be used (``TRIMTAB_SHM``, read at the edge).
    """

    def __init__(self, job: str, enabled: bool) -> None:
        self.job = job
        self.enabled = enabled
        self._prefix = job_prefix(job)
        # (chunk id, slot) -> the arena its copies go through
        self._own: dict[tuple[int, int], Arena] = {}
        self._mapped: dict[str, Arena] = {}
        self._chunk_arenas: dict[int, set[str]] = {}  # chunk id -> the names mapped for it

    def put(
        self, index: int, cid: int, frames: Sequence[Frame], slot: int = 0
    ) -> list[str | int] | None:
        """Copy chunk ``cid``'s REPLICATE ``frames`` into its arena ``slot`` (server
        ``index``'s, made or grown on first use); return the header's ``sm``, or None if
        shared memory is off or ``/dev/shm`` has no room (send the frames)."""
        if not self.enabled:
            return None
        total = sum(_nbytes(f) for f in frames)
        arena = self._own.get((cid, slot))
        if arena is None or arena.size < total:
            if arena is not None:
                arena.close()
            try:
                arena = self._own[cid, slot] = Arena.create(self.job, f"s{index}", total)
            except (OSError, ValueError) as exc:
                log.info("server %d: replicating through the sockets (%s)", index, exc)
                self.enabled = False
                self._own.pop((cid, slot), None)
                return None
        offset = 0
        for frame in frames:
            n = _nbytes(frame)
            arena.buf[offset : offset + n] = frame
            offset += n
        return [arena.name, 0, total]

    def drop(self, cid: int) -> None:
        """Remove chunk ``cid``'s own arenas: the next :meth:`put` makes new ones (a
        backup's mapping of these stays valid as long as it holds it)."""
        for slot in (0, 1):
            arena = self._own.pop((cid, slot), None)
            if arena is not None:
                arena.close()

    def read(
        self, msg: ReplicateHeader, sm: object, frames: Sequence[memoryview]
    ) -> list[memoryview]:
        """The frames of a REPLICATE (``msg``, read) whose bytes are in its sender's
        arena (``sm``): the value's, then each state tensor's, as views of the arena.
        Raises :class:`ProtocolError`: MALFORMED for an ``sm`` not ``[name, offset,
        bytes]``, frames besides it, sizes that do not add up, or bytes outside the
        arena; FORBIDDEN for an arena not the sender's; NO_SHM if it cannot be mapped."""
        if (
            frames
            or not isinstance(sm, list)
            or len(sm) != 3
            or not isinstance(sm[0], str)
            or not all(type(x) is int for x in sm[1:])
        ):
            raise ProtocolError(
                ErrorCode.MALFORMED.value, "REPLICATE: 'sm' must be [arena, offset, bytes] alone"
            )
        name, offset, total = sm
        if not name.startswith(f"{self._prefix}s{msg['s']}-"):
            raise ProtocolError(
                ErrorCode.FORBIDDEN.value, f"{name!r} is not server {msg['s']}'s arena"
            )
        sizes = [msg["n"] * DTYPE_SIZES.get(msg["dt"], 0)]
        for entry in msg.get("st", {}).values():
            if entry[0] == "t":
                if len(entry) != 3 or not isinstance(entry[2], list):
                    raise ProtocolError(ErrorCode.MALFORMED.value, "REPLICATE: a bad state tensor")
                numel = 1
                for d in entry[2]:
                    numel *= d if type(d) is int and d >= 0 else -1
                sizes.append(max(numel, -1) * DTYPE_SIZES.get(str(entry[1]), -1))
        if any(s < 0 for s in sizes) or sum(sizes) != total:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"REPLICATE: {total} bytes for frames of {sizes}"
            )
        arena = self._mapped.get(name)
        if arena is None:
            if len(self._mapped) >= MAX_ARENAS:
                raise ProtocolError(ErrorCode.NO_SHM.value, "too many arenas mapped")
            try:
                arena = Arena.attach(name)
            except (OSError, ValueError) as exc:
                raise ProtocolError(ErrorCode.NO_SHM.value, f"cannot map {name!r}: {exc}") from None
            self._mapped[name] = arena
            self._chunk_arenas.setdefault(msg["c"], set()).add(name)
        views = []
        try:
            for size in sizes:
                views.append(arena.view(offset, size))
                offset += size
        except ValueError as exc:
            raise ProtocolError(ErrorCode.MALFORMED.value, str(exc)) from None
        return views

    def unmap(self, cid: int) -> None:
        """Unmap the arenas mapped for chunk ``cid`` (its copy here is gone or read out);
        their memory is freed once their primary removed them and no view is left."""
        for name in self._chunk_arenas.pop(cid, ()):
            arena = self._mapped.pop(name, None)
            if arena is not None:
                arena.close()

    def close(self) -> None:
        """Remove this server's arenas, unmap the others'. Idempotent; never raises."""
        for arena in [*self._own.values(), *self._mapped.values()]:
            arena.close()
        self._own.clear()
        self._mapped.clear()
        self._chunk_arenas.clear()
