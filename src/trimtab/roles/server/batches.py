"""A server's side of batches (:mod:`trimtab.protocol.batch`): a BATCH opened into its
parts, each served as the request it is, and their replies gathered into one.

Every reply a part gets (a VALUE now or once its round completes, a MOVED, an ERROR)
goes through :meth:`NodeLoop.send`, which hands it to the batch (the loop's
``gathered``); the batch's reply leaves once its last part is answered. Not
thread-safe: the server's loop owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from trimtab.errors import ProtocolError
from trimtab.protocol import batch
from trimtab.protocol.messages import Data, ErrorCode, Header, decode, encode
from trimtab.runtime.loop import NodeLoop
from trimtab.transport import Frame, Peer

_ROWS = (int(Data.PUSH), int(Data.PULL))


class _Batch:
    """One BATCH's replies, as they come."""

    __slots__ = ("left", "parts", "peer", "rank", "rid", "rids")

    def __init__(self, peer: Peer, rank: int, rid: int, rids: list[int]) -> None:
        self.peer, self.rank, self.rid, self.rids = peer, rank, rid, rids
        self.parts: list[list[Any]] = [[] for _ in rids]
        self.left = len(rids)


class Batches:
    """Opens BATCHes and sends each one's reply once complete, through ``loop``."""

    def __init__(self, loop: NodeLoop) -> None:
        self._loop = loop
        #: Batches opened, not yet answered in full.
        self._open: set[_Batch] = set()
        #: Batches and parts opened in all.
        self.opened = 0
        self.parts = 0

    @property
    def open_batches(self) -> int:
        """How many batches still owe a part's reply."""
        return len(self._open)

    def open(
        self,
        peer: Peer,
        rank: int,
        header: Header,
        frames: Sequence[memoryview],
        check: Callable[[Header], object],
    ) -> list[tuple[list[memoryview], Header]]:
        """The parts of BATCH ``header`` from ``peer``, worker ``rank`` (``frames``: those after its
        header), each ``(its frames, its header decoded)``, their replies now owed to
        the batch. Every part's header is checked before any is registered: it decodes
        (this job's), is a row PUSH or PULL (``sr``) with a positive request id of its
        own, and passes ``check`` (the worker's credential). Raises
        :class:`ProtocolError` (MALFORMED, or what ``check`` raises) with nothing
        registered. Never blocks."""
        job = self._loop.job
        parts = batch.unpack(header, frames)
        out: list[tuple[list[memoryview], Header]] = []
        seen: set[int] = set()
        for part in parts:
            h = decode(part[0], job)
            rid = h["i"]
            if h.get("o") not in _ROWS or "sr" not in h or type(rid) is not int or rid <= 0:
                raise ProtocolError(
                    ErrorCode.MALFORMED.value,
                    "a batch carries row PULLs and row PUSHes ('sr') with request ids > 0",
                )
            if rid in seen or (peer, rid) in self._loop.gathered:
                raise ProtocolError(ErrorCode.MALFORMED.value, f"request id {rid} twice")
            seen.add(rid)
            check(h)
            out.append((part, h))
        pending = _Batch(peer, rank, int(header["i"]), [h["i"] for _, h in out])
        self._open.add(pending)
        self.opened += 1
        self.parts += len(out)
        for k, (_, h) in enumerate(out):
            self._loop.gathered[(peer, h["i"])] = self._keeper(pending, k)
        return out

    def _keeper(self, pending: _Batch, k: int) -> Callable[[Peer, Any, Sequence[Frame]], None]:
        def keep(peer: Peer, header: Any, frames: Sequence[Frame]) -> None:
            pending.parts[k] = [encode(header), *frames]
            pending.left -= 1
            if pending.left == 0:
                self._open.discard(pending)
                self._loop.transport.send(
                    peer, batch.pack(pending.rid, self._loop.job, pending.parts)
                )

        return keep

    def workers(self, ranks: Iterable[int]) -> int:
        """The job's workers are ``ranks`` now: forget the batches of any other (a lost
        worker's parts may never be answered, and its batch's reply would go nowhere),
        so that nothing is held for it. Returns how many were forgotten. Never blocks."""
        keep = set(ranks)
        gone = [b for b in self._open if b.rank not in keep]
        for b in gone:
            self._open.discard(b)
            for rid in b.rids:
                self._loop.gathered.pop((b.peer, rid), None)
        return len(gone)
