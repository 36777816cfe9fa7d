"""A server's lifecycle, and a chunk's at one server while placement changes move it
between servers."""

from __future__ import annotations

import enum

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import ErrorCode
from trimtab.transport import Peer


class ServerState(enum.Enum):
    """A server's lifecycle. Legal transitions:
    JOINING -> SERVING (registered) -> STOPPED (shutdown or abort)."""

    JOINING = "joining"
    SERVING = "serving"
    STOPPED = "stopped"


class ChunkPhase(enum.Enum):
    """Where a chunk stands at one server. Legal transitions (``None``: the server has
    nothing of the chunk)::

        None     -> OWNED     a MAP gives it to this server (the job's first placement)
        None     -> ARRIVING  a MIGRATE map gives it to this server; its old owner will
                              hand it over (requests for it wait meanwhile)
        ARRIVING -> OWNED     its HANDOVER came: the queued requests are served
        OWNED    -> LEAVING   a MIGRATE map gives it to another server from a cut clock;
                              pushes for clocks before the cut are still merged here
        LEAVING  -> HANDED    every round before the cut is applied and answered: the
                              HANDOVER (value, optimizer state, version) is sent
        HANDED   -> None      the new owner acknowledged it (the coordinator is told)

    OWNED and LEAVING chunks are in the server's :class:`~trimtab.roles.server.store.
    ChunkStore`; a chunk that is simply OWNED has no :class:`Move`.
    """

    OWNED = "owned"
    LEAVING = "leaving"
    HANDED = "handed"
    ARRIVING = "arriving"


#: For each phase (None: absent), the phases it may become.
TRANSITIONS: dict[ChunkPhase | None, frozenset[ChunkPhase | None]] = {
    None: frozenset({ChunkPhase.OWNED, ChunkPhase.ARRIVING}),
    ChunkPhase.ARRIVING: frozenset({ChunkPhase.OWNED}),
    ChunkPhase.OWNED: frozenset({ChunkPhase.LEAVING}),
    ChunkPhase.LEAVING: frozenset({ChunkPhase.HANDED}),
    ChunkPhase.HANDED: frozenset({None}),
}


def check_transition(chunk: int, was: ChunkPhase | None, to: ChunkPhase | None) -> None:
    """Raise a BAD_STATE :class:`ProtocolError` unless ``was -> to`` is legal. Never
    blocks."""
    if to not in TRANSITIONS[was]:
        raise ProtocolError(
            ErrorCode.BAD_STATE.value,
            f"chunk {chunk} cannot go from {_name(was)} to {_name(to)}",
        )


def _name(phase: ChunkPhase | None) -> str:
    return "absent" if phase is None else phase.value


class Move:
    """A chunk on the move at this server: its phase and what that phase needs.

    Attributes:
        chunk: the chunk id.
        phase: LEAVING, HANDED or ARRIVING.
        cut: (LEAVING, HANDED) the first clock that is the new owner's.
        owner: (LEAVING, HANDED) the new owner's server index.
        rid: (HANDED) the request id of the HANDOVER, echoed by its ACK.
        peer: (HANDED) where the HANDOVER went: only its ACK (or ERROR) settles it.
        source: (ARRIVING) the old owner's index, the only server that may hand it
            over (-1: unknown to a server that joined after the job was placed).
        queued: (ARRIVING) requests that came before the chunk, in order.

    Not thread-safe: the server's loop owns it.
    """

    __slots__ = ("chunk", "cut", "owner", "peer", "phase", "queued", "rid", "source")

    def __init__(self, chunk: int, phase: ChunkPhase, cut: int = -1, owner: int = -1) -> None:
        check_transition(chunk, ChunkPhase.OWNED if phase is ChunkPhase.LEAVING else None, phase)
        self.chunk = chunk
        self.phase = phase
        self.cut = cut
        self.owner = owner
        self.rid = 0
        self.peer: Peer | None = None
        self.source = -1
        self.queued: list[tuple[Peer, list[memoryview]]] = []

    def to(self, phase: ChunkPhase | None) -> None:
        """Move to ``phase`` (None: the entry is done with). Raises as
        :func:`check_transition`."""
        check_transition(self.chunk, self.phase, phase)
        if phase is not None:
            self.phase = phase
