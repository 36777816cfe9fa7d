"""Which of the messages a server finds queued together it handles first (P3): pushes of
the first layers, so that their values return first and the next forward can start.
Before them, replication's (``--replicas 1``): a REPLICATE, whose ACK releases another
server's values, and such an ACK, which releases this server's."""

from __future__ import annotations

from collections.abc import Sequence

from trimtab.protocol.messages import Data, Header, decode
from trimtab.protocol.replica import FIRST_RID
from trimtab.transport import Envelope, Peer

#: A message as the server handles it: sender, frames, and its header if already read.
Queued = tuple[Peer, list[memoryview], Header | None]

_PUSH = int(Data.PUSH)
_REPLICATE = int(Data.REPLICATE)
_ACK = int(Data.ACK)


def by_priority(batch: Sequence[Envelope], coordinator: Peer, job: str) -> list[Queued]:
    """``batch`` decoded (but the coordinator's messages, and those that do not decode)
    and in :func:`order`'s order; a batch of one as it is, undecoded. Pure; never blocks
    or raises."""
    if len(batch) == 1:
        return [(batch[0].peer, batch[0].frames, None)]
    decoded: list[Queued] = []
    for env in batch:
        header = None
        if env.peer != coordinator:
            try:  # noqa: SIM105 (contextlib.suppress: three Python calls a message)
                header = decode(env.frames[0], job)
            except Exception:  # undecodable: answered in order
                pass
        decoded.append((env.peer, env.frames, header))
    return order(decoded)


def order(batch: list[Queued]) -> list[Queued]:
    """``batch`` (headers decoded where they decode) in the order to handle it. Each run
    of consecutive pushes is sorted by chunk id (stable: one chunk's pushes keep their
    order); every other message keeps its place, so nothing is reordered around a control
    or migration message. A message without a header (undecodable, or the
    coordinator's) keeps its place too (it is refused, or handled, in order).
    Replication's messages (a REPLICATE, an ACK of one) go first, in their order: they
    concern chunks the pushes here do not (a backup's copies) or answer rounds already
    applied. Pure; never blocks or raises."""
    first: list[Queued] = []
    out: list[Queued] = []
    run: list[Queued] = []
    for message in batch:
        header = message[2]
        if header is not None:
            op = header.get("o")
            if op == _PUSH and isinstance(header.get("c"), int):
                run.append(message)
                continue
            if op == _REPLICATE or (op == _ACK and header.get("i", 0) >= FIRST_RID):
                first.append(message)
                continue
        if run:
            out.extend(sorted(run, key=_chunk) if len(run) > 1 else run)
            run = []
        out.append(message)
    if run:
        out.extend(sorted(run, key=_chunk) if len(run) > 1 else run)
    return first + out if first else out


def _chunk(message: Queued) -> int:
    return message[2]["c"]  # type: ignore[index,no-any-return]
