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


@dataclasses.dataclass
class _Value:
    """A broadcast's value put, and who took it (ranks). ``peer``: its root's, owed OK
    (None once nobody is: the root was lost). ``needed``: the takers it waits for, the
    other workers of the job when it was put (a worker admitted later does not call it)."""

    meta: Header
    frames: Sequence[Frame]
    peer: Peer | None
    rid: int
    rank: int
    takers: set[int]
    needed: int


class Collectives:
    """Named barriers of every worker; broadcasts: the root puts a value once, each
    other worker gets it (before or after the put), and it is dropped once all have; and
    gathers (Horovod's collectives): every worker sends its part of a key, and once all
    have, each gets every part, in rank order. Not thread-safe: the coordinator's loop
    owns it."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._barriers: dict[str, list[tuple[Peer, int]]] = {}
        self._values: dict[str, _Value] = {}
        self._getters: dict[str, list[tuple[Peer, int, int]]] = {}  # (peer, rid, rank)
        self._taken: dict[str, set[int]] = {}  # replayed gets of values not put (yet)
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

    def put(
        self, peer: Peer, rid: int, rank: int, key: str, meta: Header, frames: Sequence[Frame]
    ) -> Outbox:
        """Root worker ``rank``'s BCAST_PUT of ``key``: the value to every worker that
        asked already, and OK to the root once every other worker took it (a broadcast
        is a collective: the root's frames stay its own until then, so that a
        replacement coordinator gets them again from its resent put). Raises a
        BAD_STATE :class:`ProtocolError` if ``key`` was put, or :data:`MAX_VALUES`
        values wait to be taken."""
        if key in self._values:
            raise ProtocolError(ErrorCode.BAD_STATE.value, f"broadcast {key!r} was already put")
        if len(self._values) >= MAX_VALUES:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value, f"{len(self._values)} broadcasts wait to be taken"
            )
        # Takers known already: workers that took it from a coordinator before this one.
        taken = self._taken.pop(key, set())
        self._values[key] = _Value(meta, frames, peer, rid, rank, taken, self.num_workers - 1)
        out: Outbox = []
        for p, r, taker in self._getters.pop(key, []):
            self._released(p)
            out += self._serve(p, r, taker, key)
        return out + self._settle(key)

    def get(self, peer: Peer, rid: int, rank: int, key: str, *, replayed: bool = False) -> Outbox:
        """Worker ``rank``'s BCAST_GET of ``key``: the value now if it was put, else
        later. ``replayed``: the worker took it from a coordinator before this one (it
        says so after a failover): counted as taken, not answered."""
        if replayed:
            if key in self._values:
                self._values[key].takers.add(rank)
                return self._settle(key)
            if key not in self._taken and len(self._taken) >= MAX_VALUES:
                del self._taken[next(iter(self._taken))]  # (the oldest: a stale replay)
            self._taken.setdefault(key, set()).add(rank)
            return []
        if key in self._values:
            return self._serve(peer, rid, rank, key) + self._settle(key)
        self._wait(peer)
        self._getters.setdefault(key, []).append((peer, rid, rank))
        return []

    def _serve(self, peer: Peer, rid: int, rank: int, key: str) -> Outbox:
        value = self._values[key]
        if rank == value.rank or rank in value.takers:
            msg = f"broadcast {key!r} was taken by this worker already, or it is its root"
            return [Refuse(peer, rid, ErrorCode.BAD_STATE.value, msg)]
        value.takers.add(rank)
        return [Send(peer, headers.bcast_value(rid=rid, meta=value.meta), value.frames)]

    def _settle(self, key: str) -> Outbox:
        """Broadcast ``key``'s OK to its root, once every other worker took it (of those
        when it was put, and still in the job: :meth:`resize`); then the value is
        dropped."""
        value = self._values[key]
        if len(value.takers) < min(value.needed, self.num_workers - 1):
            return []
        del self._values[key]
        return [] if value.peer is None else [Send(value.peer, headers.ok(rid=value.rid))]

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
        joiners were admitted): barriers and broadcasts count them from now on, and one
        that every worker taking part reached (took) is released. Never blocks."""
        self.num_workers = max(1, num_workers)
        out: Outbox = []
        for key in list(self._values):
            out += self._settle(key)
        for name, arrived in list(self._barriers.items()):
            if len(arrived) >= self.num_workers:
                del self._barriers[name]
                for p, _ in arrived:
                    self._released(p)
                out += [Send(p, headers.ok(rid=r)) for p, r in arrived]
        return out

    def left(self, rank: int) -> Outbox:
        """Worker ``rank`` left the job: refuse (BAD_STATE) every gather waiting without
        its part, and each one sent from now on, and the root of each broadcast it did
        not take, rather than keep them waiting forever."""
        self._left.add(rank)
        out: Outbox = []
        for key, value in list(self._values.items()):
            if value.rank == rank:
                value.peer = None  # (its value stays for the others: nobody to answer)
            elif rank not in value.takers and value.peer is not None:
                del self._values[key]
                msg = (
                    f"broadcast {key!r}: worker {rank} left the job without taking it; "
                    "every worker must call each collective"
                )
                out.append(Refuse(value.peer, value.rid, ErrorCode.BAD_STATE.value, msg))
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
