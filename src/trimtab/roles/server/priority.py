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


def by_priority(batch: Sequence[Envelope], coordinator: Peer, job: str) -> list[Queued]:
    """``batch`` in the order to handle it, each message with its header when it is a
    push. Each run of consecutive pushes is sorted by chunk id (stable: one chunk's
    pushes keep their order); every other message keeps its place, so nothing is
    reordered around a control or migration message. A message that does not decode
    keeps its place too (it is refused in order). Replication's messages (a REPLICATE,
    an ACK of one) go first, in their order: they concern chunks the pushes here do not
    (a backup's copies) or answer rounds already applied. Pure; never blocks or raises."""
    if len(batch) == 1:
        return [(batch[0].peer, batch[0].frames, None)]
    first: list[Queued] = []
    out: list[Queued] = []
    run: list[Queued] = []
    for env in batch:
        header = None
        if env.peer != coordinator:
            try:  # noqa: SIM105 (contextlib.suppress: three Python calls a message)
                header = decode(env.frames[0], job)
            except Exception:  # undecodable: answered in order
                pass
        if header is not None and header.get("o") == Data.PUSH and isinstance(header.get("c"), int):
            run.append((env.peer, env.frames, header))
            continue
        if header is not None and (
            header.get("o") == Data.REPLICATE
            or (header.get("o") == Data.ACK and header.get("i", 0) >= FIRST_RID)
        ):
            first.append((env.peer, env.frames, header))
            continue
        out.extend(sorted(run, key=lambda m: m[2]["c"]))  # type: ignore[index]
        run = []
        out.append((env.peer, env.frames, header))
    out.extend(sorted(run, key=lambda m: m[2]["c"]))  # type: ignore[index]
    return first + out if first else out
