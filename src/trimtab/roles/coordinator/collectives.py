"""Barriers and the broadcast relay among a job's workers. Pure: each operation returns
the replies to send."""

from __future__ import annotations

from collections.abc import Sequence

from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.transport.base import Frame, Peer


class Collectives:
    """Named barriers of every worker, and broadcasts: the root puts a value once, each
    other worker gets it (before or after the put), and it is dropped once all have.
    Not thread-safe: the coordinator's loop owns it."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._barriers: dict[str, list[tuple[Peer, int]]] = {}
        self._values: dict[str, tuple[Header, Sequence[Frame], int]] = {}
        self._getters: dict[str, list[tuple[Peer, int]]] = {}

    def barrier(self, peer: Peer, rid: int, name: str) -> Outbox:
        """A worker reached barrier ``name``; everyone is released (OK) once all have."""
        arrived = self._barriers.setdefault(name, [])
        arrived.append((peer, rid))
        if len(arrived) < self.num_workers:
            return []
        del self._barriers[name]
        return [Send(p, headers.ok(rid=r)) for p, r in arrived]

    def put(self, peer: Peer, rid: int, key: str, meta: Header, frames: Sequence[Frame]) -> Outbox:
        """The root's BCAST_PUT of ``key``: OK to it, then the value to every worker that
        asked already. Raises a BAD_STATE :class:`ProtocolError` if ``key`` was put."""
        if key in self._values:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"broadcast {key!r} was already put")
        self._values[key] = (meta, frames, 0)
        out: Outbox = [Send(peer, headers.ok(rid=rid))]
        for p, r in self._getters.pop(key, []):
            out.append(self._serve(p, r, key))
        return out

    def get(self, peer: Peer, rid: int, key: str) -> Outbox:
        """A worker's BCAST_GET of ``key``: the value now if it was put, else later."""
        if key in self._values:
            return [self._serve(peer, rid, key)]
        self._getters.setdefault(key, []).append((peer, rid))
        return []

    def _serve(self, peer: Peer, rid: int, key: str) -> Send:
        meta, frames, served = self._values[key]
        # Every worker but the root gets it once; then it is dropped.
        if served + 1 >= self.num_workers - 1:
            del self._values[key]
        else:
            self._values[key] = (meta, frames, served + 1)
        return Send(peer, headers.bcast_value(rid=rid, meta=meta), frames)
