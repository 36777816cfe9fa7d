"""A worker's side of batches (:mod:`trimtab.protocol.batch`): data requests held to go
together, one BATCH per server, and the replies of a BATCH taken apart.

A request held (``WorkerClient.request(..., held=True)``) has its id and future at
once, as any; it leaves with the others held for its server when the client flushes
them (:meth:`WorkerClient.flush_held`, or any wait for a reply). Its reply comes as a
part of the BATCH's reply and completes its future as if it had travelled alone: a
part answered MOVED or ERROR fails alone, and its waiter resends it alone. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from trimtab.errors import ProtocolError, RemoteError
from trimtab.protocol import batch
from trimtab.protocol.messages import Data, Header
from trimtab.transport import Frame


class HeldRequests:
    """Requests held per server address, and the batches sent whose reply is owed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Requests held, by server address (the same dict, never replaced: whether
        #: any is held, without a call).
        self.by_address: dict[str, list[tuple[int, list[Frame]]]] = {}
        self._parts_of: dict[int, list[int]] = {}  # a batch's request id -> its parts'
        #: The same dict, never replaced: whether a reply is a batch's, without a call.
        self.batches = self._parts_of

    def __bool__(self) -> bool:
        return bool(self.by_address)

    def hold(self, to: str, rid: int, frames: list[Frame]) -> None:
        """Hold request ``rid`` (its frames, header encoded first) for server ``to``."""
        with self._lock:
            self.by_address.setdefault(to, []).append((rid, frames))

    def take(
        self, rids: Iterator[int], job: str, extra: dict[str, Any]
    ) -> list[tuple[str, list[Frame]]]:
        """The messages that send every request held: a server's lone request as it is,
        several as one BATCH (its id from ``rids``, ``extra`` in its header: the
        worker's rank and credential), at most :data:`~trimtab.protocol.batch.MAX_PARTS`
        a batch. Never blocks (beyond a short lock)."""
        with self._lock:
            held = dict(self.by_address)
            self.by_address.clear()
        out: list[tuple[str, list[Frame]]] = []
        for to, parts in held.items():
            for at in range(0, len(parts), batch.MAX_PARTS):
                some = parts[at : at + batch.MAX_PARTS]
                if len(some) == 1:
                    out.append((to, some[0][1]))
                    continue
                rid = next(rids)
                with self._lock:
                    self._parts_of[rid] = [r for r, _ in some]
                out.append((to, batch.pack(rid, job, [f for _, f in some], extra)))
        return out

    def owns(self, rid: object) -> bool:
        """Whether ``rid`` is a batch's request id, its reply owed."""
        return rid in self._parts_of

    def answered(
        self,
        header: Header,
        frames: list[memoryview],
        pending: dict[int, Any],
        lock: threading.Lock,
    ) -> list[list[memoryview]]:
        """The parts' replies of a BATCH reply (``header`` decoded; ``frames``: the
        whole message), each a message to take as it is. A batch refused whole (an
        ERROR), or a reply that does not add up, fails every part's future (taken out
        of ``pending``, the client's, under its ``lock``) and returns none. Never blocks
        (beyond short locks)."""
        with self._lock:
            rids = self._parts_of.pop(header["i"], [])
        failed: BaseException
        if header.get("o") != Data.BATCH:
            failed = RemoteError(str(header.get("code")), str(header.get("msg")))
        else:
            try:
                return batch.unpack(header, frames[1:])
            except ProtocolError as exc:
                failed = exc
        with lock:
            futures = [pending.pop(rid, None) for rid in rids]
        for f in futures:
            if f is not None:
                f.set_exception(failed)
        return []
