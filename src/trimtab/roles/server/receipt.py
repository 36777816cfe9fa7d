"""A server's side of P3's credit (:mod:`trimtab.runtime.credit`), both ways.

- **Receipts of pushes**: a worker that bounds its push bytes in flight per server marks
  its pushes ``ak``. The server answers each with a CREDIT at once, as it reads the push
  off its socket and before it merges or answers any message of the batch, so the
  worker's credit never waits for a round to complete: under BSP that would wait for
  the other workers' pushes, which may themselves be held back for credit.
- **Its values, held to the worker's window**: such a push also carries ``vk``, the
  value bytes that worker takes in flight. A VALUE that goes through the socket is sent
  marked ``ak`` while it fits; the others are held, and each CREDIT the worker sends as
  it reads a value releases the held ones that fit, first layers first (the lowest
  chunk id). Without it a completed round's values all go to the socket at once, and
  the first layer's value, whose round completes last, queues behind every other one
  on the link. Values into shared memory, and pushes without ``vk``, are not held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

import msgpack
import torch

from trimtab.protocol import headers
from trimtab.protocol.credit import CreditFrames
from trimtab.protocol.messages import INLINE_MAX, Data, Header, decode, inline
from trimtab.roles.server.growing import counters
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.priority import Queued
from trimtab.roles.server.slots import Slot
from trimtab.roles.server.store import Chunk, Reply
from trimtab.runtime.credit import CreditGate
from trimtab.runtime.loop import NodeLoop
from trimtab.runtime.tensors import WIRE_DTYPES, as_bytes
from trimtab.runtime.trace import Trace
from trimtab.transport import Envelope, Peer

_PUSH = int(Data.PUSH)
_CREDIT = int(Data.CREDIT)
_VALUE = int(Data.VALUE)


class Receipts:
    """The credit a server answers and the values it holds back for it. Not
    thread-safe: the server's loop owns it.

    Args:
        loop: the server's loop, which sends.
        meter: counts the bytes of each value sent (the server's speed, for PSLD).
        ordered: release held values first layers first (``False``: in the order their
            rounds completed, to compare).
        synchronous: whether the job's consistency is synchronous now (BSP), where a
            chunk's value changes only once every worker pushed again.
    """

    def __init__(
        self,
        loop: NodeLoop,
        meter: LoadMeter,
        *,
        ordered: bool = True,
        synchronous: Callable[[], bool] = lambda: True,
    ) -> None:
        self._loop = loop
        self._meter = meter
        self._synchronous = synchronous
        # A CREDIT's bytes before its rid's msgpack integer (rid 0 packs as one byte),
        # and msgpack's packer kept (the loop's thread only): what CreditFrames and
        # encode give, without a packer made a message (tests/unit/test_steady_push.py).
        self._credit_head = CreditFrames(loop.job)(0)[:-1]
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self._send = loop.transport.send
        self._peer_of: dict[int, Peer] = {}  # a bounded worker's rank -> its socket
        #: Value bytes in flight per worker (its socket), each worker's own window (every
        #: value held is admitted with one: the gate's own, 1 byte, is never used).
        self.values: CreditGate[Peer, tuple[Header, list[memoryview]]] = CreditGate(
            1, ordered=ordered
        )
        self.trace: Trace | None = None  # --trace: each reply marked on it

    def acknowledge(self, burst: Sequence[Envelope], coordinator: Peer) -> list[Queued]:
        """One pass over ``burst`` (messages read together, each sender's in its order):
        each data message's header decoded, once; a worker's CREDIT consumed (it read
        one of our values: the held values it releases are sent); a CREDIT sent at once
        for each push that asks for one (``ak``). Returns the rest, in the same order,
        each with its header (so that it is not decoded twice); the coordinator's
        messages undecoded (its handler reads them), and a message that does not decode
        with none: it is refused in its turn. Blocks only as :meth:`NodeLoop.send` does;
        never raises for what a peer sent."""
        job = self._loop.job
        credit_head, pack = self._credit_head, self._pack
        out: list[Queued] = []
        for peer, frames in burst:
            header = None
            if peer != coordinator and frames:
                try:  # noqa: SIM105 (contextlib.suppress: three Python calls a message)
                    header = decode(frames[0], job)
                except Exception:  # undecodable: answered in order
                    pass
            if header is not None:
                op = header["o"]  # (decode made sure of an int op and rid)
                if op == _PUSH:
                    rid = header["i"]
                    if header.get("ak") and type(rid) is int:
                        self._send(peer, [credit_head + pack(rid)])  # (CreditFrames')
                elif op == _CREDIT and len(frames) == 1:  # a worker read one of our values
                    for held, held_frames in self.values.credit(peer, header["i"]):
                        if self._loop.gathered:  # (NodeLoop.send's own case)
                            self._loop.send(peer, held, held_frames)
                        else:  # (NodeLoop.send's stamp and encode, inlined: the same bytes)
                            held["j"] = job
                            self._send(peer, [pack(held), *held_frames])
                    continue
            out.append((peer, frames, header))
        return out

    def reply(self, r: Reply) -> None:
        """Send a push's reply (:meth:`value`, held to its worker's window). A rank's
        new socket (a worker that joined in a lost one's place) ends the old one's
        credit. Blocks only as :meth:`NodeLoop.send` does."""
        if self.trace is not None:  # (its push's clock: the latest of its worker's)
            self.trace.mark("reply", r.chunk.spec.id, r.chunk.last_clock.get(r.rank, -1), r.rank)
        if r.window > 0:
            old = self._peer_of.get(r.rank)
            if old is not None and old != r.peer:
                self.values.forget(old)
            self._peer_of[r.rank] = r.peer
        if r.rows is not None:
            self.rows(r.peer, r.rid, r.chunk, r.rows, r.value, r.round, r.rank)
            return
        self.value(r.peer, r.rid, r.chunk, r.value, r.round, r.slot, r.window)

    def current(self, r: Reply) -> None:
        """Send a BSP round's reply as :meth:`reply` does (the same bytes, the same
        window), taking the common case in one call: the chunk's value, through the
        socket, too large to inline, no trace. Anything else goes to :meth:`reply`.
        Call only in a synchronous job. Blocks only as :meth:`NodeLoop.send` does."""
        chunk = r.chunk
        frame = chunk.value_bytes
        if (
            r.value is not chunk.value
            or r.rows is not None
            or r.slot is not None
            or self.trace is not None
            or frame.nbytes <= INLINE_MAX
        ):
            self.reply(r)
            return
        peer, rid, window = r.peer, r.rid, r.window
        header = {
            "o": _VALUE,
            "i": rid,
            "c": chunk.spec.id,
            "v": chunk.version,
            "k": r.round,
            "n": chunk.spec.numel,
            "dt": WIRE_DTYPES[chunk.value.dtype],
        }  # (headers.value's keys, in its order: the same bytes)
        self._meter.sent(frame.nbytes)
        if window > 0:
            old = self._peer_of.get(r.rank)
            if old is not None and old != peer:
                self.values.forget(old)
            self._peer_of[r.rank] = peer
            header["ak"] = True
            message = (header, [frame])
            if not self.values.admit(peer, rid, frame.nbytes, chunk.spec.id, message, window):
                return
        loop = self._loop
        if loop.gathered:  # (a part of a batch: its reply goes into the batch's)
            loop.send(peer, header, [frame])
            return
        header["j"] = loop.job  # (NodeLoop.send's stamp and encode, inlined: the same bytes)
        self._send(peer, [self._pack(header), frame])

    def rows(
        self,
        peer: Peer,
        rid: int,
        chunk: Chunk,
        ids: torch.Tensor,
        t: torch.Tensor | None,
        round_: int,
        rank: int,
    ) -> None:
        """Send a row VALUE of ``chunk`` (``sr``) to worker ``rank``: the ids of the rows
        that changed and ``t``, their elements in the chunk, as two frames (none for no
        rows), with the version of the worker's hot set they follow (``hv``). Through
        the socket, never held: a reply of a sparse push is its rows only. Blocks only
        as :meth:`NodeLoop.send` does."""
        assert t is not None
        header = headers.value(
            rid=rid,
            chunk=chunk.spec.id,
            version=chunk.version,
            round=round_,
            numel=t.numel(),
            dtype=WIRE_DTYPES[t.dtype],
        )
        header["sr"] = ids.numel()
        held = chunk.hot.get(rank)
        if held is not None:  # the version of the worker's hot set these rows follow
            header["hv"] = held[0]
        grown = counters(chunk)
        if grown is not None:
            header["gc"] = grown
        frames = [as_bytes(ids.contiguous()), as_bytes(t.contiguous())] if ids.numel() else []
        self._meter.sent(sum(f.nbytes for f in frames))
        self._loop.send(peer, header, frames)

    def workers(self, ranks: Iterable[int]) -> None:
        """The job's workers are ``ranks`` now: drop what is held for any other (its
        values would never be read, nor credited). Never blocks."""
        keep = set(ranks)
        for rank in [rank for rank in self._peer_of if rank not in keep]:
            self.values.forget(self._peer_of.pop(rank))

    def value(
        self,
        peer: Peer,
        rid: int,
        chunk: Chunk,
        t: torch.Tensor | None,
        round_: int,
        slot: Slot | None,
        window: int = 0,
    ) -> None:
        """Send a VALUE of ``chunk`` carrying ``t`` (None: no value, ``z``), into the
        push's shared-memory ``slot`` when it has one and ``t`` fits; through the socket
        otherwise, held back while ``window`` (the push's ``vk``; 0: no bound) is full.
        Blocks only as :meth:`NodeLoop.send` does."""
        spec = chunk.spec
        header = headers.value(
            rid=rid,
            chunk=spec.id,
            version=chunk.version,
            round=round_,
            numel=spec.numel,
            dtype=None if t is None else WIRE_DTYPES[t.dtype],
        )
        if t is None:
            self._loop.send(peer, header)
            return
        if t is chunk.value:
            frame = chunk.value_bytes
        elif t is chunk.merge:
            frame = chunk.merge_bytes
        elif t is chunk.last_mean:
            frame = chunk.last_mean_bytes
        else:
            frame = as_bytes(t)
        self._meter.sent(frame.nbytes)  # what this server moves, both ways, for its speed
        if slot is not None and frame.nbytes <= slot.capacity:
            # The push's gradient was consumed on arrival: its slot takes the value.
            slot.arena.buf[slot.offset : slot.offset + frame.nbytes] = frame
            header["sm"] = headers.IN_SLOT
            self._loop.send(peer, header)
            return
        if t is chunk.merge:
            # A round's sum (summation mode) or mean gradient: the next round's first
            # push overwrites it, and may come (from another worker) before this one
            # left the socket or, held, was sent at all. A copy.
            frame = memoryview(bytes(frame))
        frames = inline(header, frame)
        if frames and t is chunk.value and not self._synchronous():
            # A view of the chunk's buffer only under BSP, where the chunk changes once
            # this worker pushed again, after reading it. In an asynchronous job any
            # push updates it in place, while ZeroMQ's I/O thread (or the lane's queue,
            # or the credit window) may still read the view: a copy, as it is now.
            frames = [memoryview(bytes(frame))]
        if window > 0 and frames:
            header["ak"] = True
            message = (cast(Header, header), frames)
            if not self.values.admit(peer, rid, frame.nbytes, spec.id, message, window):
                return
        self._loop.send(peer, header, frames)
