"""Barriers, the broadcast relay and adoptions among a job's workers. Pure: each operation returns
the replies to send."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.outbox import Outbox, Refuse, Send
from trimtab.transport.base import Frame, Peer

#: Barrier arrivals and broadcast gets one peer may have waiting at once (a worker waits
#: in one at a time; the rest is slack for threads of its own).
MAX_WAITING_PER_PEER = 16

#: Broadcast values put and not yet taken by every worker, at most.
MAX_VALUES = 256


class Collectives:
    """Named barriers of every worker, and broadcasts: the root puts a value once, each
    other worker gets it (before or after the put), and it is dropped once all have.
    Not thread-safe: the coordinator's loop owns it."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._barriers: dict[str, list[tuple[Peer, int]]] = {}
        self._values: dict[str, tuple[Header, Sequence[Frame], int]] = {}
        self._getters: dict[str, list[tuple[Peer, int]]] = {}
        self._waiting: dict[Peer, int] = {}  # barrier arrivals and gets, per peer
        self._adopting: list[tuple[Peer, int]] = []  # ADOPTs of the adoption forming
        self._adopt_root = -1
        #: Adoptions granted so far (the last one's number).
        self.adoptions = 0

    def adopt(self, peer: Peer, rid: int, root: int, grant: Callable[[int, int], bytes]) -> Outbox:
        """A worker's ADOPT of worker ``root``'s values; once every worker asked, each
        gets the adoption's number and grant (``grant(root, number)``), which lets the
        root's INITs reset the servers' chunks. Raises a BAD_STATE
        :class:`ProtocolError` (nothing changed) for a worker asking twice, or for
        another root than the adoption forming names."""
        if any(p == peer for p, _ in self._adopting):
            raise ProtocolError(ErrorCode.BAD_STATE.value, "this worker asked to adopt already")
        if self._adopting and root != self._adopt_root:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"the workers adopt worker {self._adopt_root}'s values, not worker {root}'s",
            )
        if not 0 <= root < self.num_workers:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"no worker {root} in this job")
        self._adopting.append((peer, rid))
        self._adopt_root = root
        if len(self._adopting) < self.num_workers:
            return []
        self.adoptions += 1
        g = grant(root, self.adoptions)
        asked, self._adopting = self._adopting, []
        return [
            Send(p, headers.adopt_reply(rid=r, number=self.adoptions, grant=g)) for p, r in asked
        ]

    def _wait(self, peer: Peer) -> None:
        """Count one more request of ``peer`` waiting here. Raises a BAD_STATE
        :class:`ProtocolError` (nothing counted) past :data:`MAX_WAITING_PER_PEER`."""
        waiting = self._waiting.get(peer, 0)
        if waiting >= MAX_WAITING_PER_PEER:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"{waiting} barriers and broadcasts of this worker wait already",
            )
        self._waiting[peer] = waiting + 1

    def _released(self, peer: Peer) -> None:
        left = self._waiting.get(peer, 0) - 1
        if left > 0:
            self._waiting[peer] = left
        else:
            self._waiting.pop(peer, None)

    def barrier(self, peer: Peer, rid: int, name: str) -> Outbox:
        """A worker reached barrier ``name``; everyone is released (OK) once all have.
        Raises a BAD_STATE :class:`ProtocolError` (nothing changed) for a worker already
        in it, or one with too many requests waiting (:data:`MAX_WAITING_PER_PEER`)."""
        arrived = self._barriers.get(name, [])
        if any(p == peer for p, _ in arrived):
            raise ProtocolError(
                ErrorCode.BAD_STATE.value, f"this worker is in barrier {name!r} already"
            )
        self._wait(peer)
        arrived.append((peer, rid))
        self._barriers[name] = arrived
        if len(arrived) < self.num_workers:
            return []
        del self._barriers[name]
        for p, _ in arrived:
            self._released(p)
        return [Send(p, headers.ok(rid=r)) for p, r in arrived]

    def put(self, peer: Peer, rid: int, key: str, meta: Header, frames: Sequence[Frame]) -> Outbox:
        """The root's BCAST_PUT of ``key``: OK to it, then the value to every worker that
        asked already. Raises a BAD_STATE :class:`ProtocolError` if ``key`` was put, or
        :data:`MAX_VALUES` values wait to be taken."""
        if key in self._values:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"broadcast {key!r} was already put")
        if len(self._values) >= MAX_VALUES:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value, f"{len(self._values)} broadcasts wait to be taken"
            )
        self._values[key] = (meta, frames, 0)
        out: Outbox = [Send(peer, headers.ok(rid=rid))]
        for p, r in self._getters.pop(key, []):
            self._released(p)
            if key in self._values:
                out.append(self._serve(p, r, key))
            else:  # more getters than workers but the root: one is no worker of the job
                msg = f"broadcast {key!r} was taken by every worker already"
                out.append(Refuse(p, r, ErrorCode.BAD_STATE.value, msg))
        return out

    def get(self, peer: Peer, rid: int, key: str) -> Outbox:
        """A worker's BCAST_GET of ``key``: the value now if it was put, else later."""
        if key in self._values:
            return [self._serve(peer, rid, key)]
        self._wait(peer)
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
