"""Barriers, the broadcast relay, adoptions and the gathers of Horovod's collectives
among a job's workers. Pure: each operation returns the replies to send."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class Part:
    """One worker's part of a gather: where to answer, what must agree, its own."""

    peer: Peer
    rid: int
    sig: str
    meta: dict[str, Any]
    frames: Sequence[Frame]


class Collectives:
    """Named barriers of every worker; broadcasts: the root puts a value once, each
    other worker gets it (before or after the put), and it is dropped once all have; and
    gathers (Horovod's collectives): every worker sends its part of a key, and once all
    have, each gets every part, in rank order. Not thread-safe: the coordinator's loop
    owns it."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._barriers: dict[str, list[tuple[Peer, int]]] = {}
        self._values: dict[str, tuple[Header, Sequence[Frame], int]] = {}
        self._getters: dict[str, list[tuple[Peer, int]]] = {}
        self._gathers: dict[str, dict[int, Part]] = {}
        self._left: set[int] = set()
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

    def gather(self, rank: int, key: str, part: Part) -> Outbox:
        """Worker ``rank``'s part of gather ``key``. Once every worker sent one, each is
        answered GATHERED with all the parts, in rank order; if their signatures differ,
        each is refused MISMATCH instead, with every rank's signature. Raises a
        BAD_STATE :class:`ProtocolError` (to this worker alone) if it sent ``key``
        already or a worker has left the job (the gather could never complete)."""
        if self._left:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"{_label(key)}: worker(s) {sorted(self._left)} left the job "
                "(shutdown() or the end of their script); every worker must call each "
                "collective",
            )
        parts = self._gathers.setdefault(key, {})
        if rank in parts:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value,
                f"{_label(key)}: worker {rank} sent it twice before it completed; "
                "give concurrent collectives different names",
            )
        parts[rank] = part
        if len(parts) < self.num_workers:
            return []
        del self._gathers[key]
        ranks = sorted(parts)
        sigs = {parts[r].sig for r in ranks}
        if len(sigs) > 1:
            said = "; ".join(f"rank {r}: {parts[r].sig}" for r in ranks)
            msg = (
                f"{_label(key)} differs between workers ({said}): call each collective "
                "in the same order on every worker, with the same dtype, shape (allgather: "
                "but the first dimension), op and root"
            )
            return [Refuse(p.peer, p.rid, ErrorCode.MISMATCH.value, msg) for p in parts.values()]
        metas = [parts[r].meta for r in ranks]
        counts = [len(parts[r].frames) for r in ranks]
        frames = [f for r in ranks for f in parts[r].frames]
        return [
            Send(p.peer, headers.gathered(rid=p.rid, metas=metas, n=counts, last=rank), frames)
            for p in parts.values()
        ]

    def resize(self, num_workers: int) -> Outbox:
        """An elastic job now has ``num_workers`` workers taking part (one was lost, or
        joiners were admitted): barriers count them from now on, and one that every
        worker taking part reached is released. Never blocks."""
        self.num_workers = max(1, num_workers)
        out: Outbox = []
        for name, arrived in list(self._barriers.items()):
            if len(arrived) >= self.num_workers:
                del self._barriers[name]
                for p, _ in arrived:
                    self._released(p)
                out += [Send(p, headers.ok(rid=r)) for p, r in arrived]
        return out

    def left(self, rank: int) -> Outbox:
        """Worker ``rank`` left the job: refuse (BAD_STATE) every gather waiting without
        its part, and each one sent from now on, rather than keep them waiting forever."""
        self._left.add(rank)
        out: Outbox = []
        for key in [k for k, parts in self._gathers.items() if rank not in parts]:
            msg = (
                f"{_label(key)}: worker {rank} left the job without calling it; every "
                "worker must call each collective"
            )
            out += [
                Refuse(p.peer, p.rid, ErrorCode.BAD_STATE.value, msg)
                for p in self._gathers.pop(key).values()
            ]
        return out

    def returned(self, rank: int) -> None:
        """Worker ``rank`` registered again after it left: its collectives are taken
        again (those refused meanwhile stay refused)."""
        self._left.discard(rank)

    def pending(self) -> dict[str, list[int]]:
        """Each unfinished gather's key and the ranks that sent it (a hung job's dump)."""
        return {k: sorted(parts) for k, parts in self._gathers.items()}


def _label(key: str) -> str:
    """A gather's key for people: ``@name`` is a user's name, ``#n`` the n-th unnamed
    collective of each worker (counted from 0)."""
    if key.startswith("#"):
        return f"unnamed collective {key} (counted on each worker from #0)"
    return f"collective {key.removeprefix('@')!r}"
