"""Which of the messages a server finds queued together it handles first (P3): pushes of
the first layers, so that their values return first and the next forward can start."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from trimtab.protocol.messages import Data, Header, decode
from trimtab.transport import Envelope, Peer

#: A message as the server handles it: sender, frames, and its header if already read.
Queued = tuple[Peer, list[memoryview], Header | None]


def by_priority(batch: Sequence[Envelope], coordinator: Peer, job: str) -> list[Queued]:
    """``batch`` in the order to handle it, each message with its header when it is a
    push. Each run of consecutive pushes is sorted by chunk id (stable: one chunk's
    pushes keep their order); every other message keeps its place, so nothing is
    reordered around a control or migration message. A message that does not decode
    keeps its place too (it is refused in order). Pure; never blocks or raises."""
    if len(batch) == 1:
        return [(batch[0].peer, batch[0].frames, None)]
    out: list[Queued] = []
    run: list[Queued] = []
    for env in batch:
        header = None
        if env.peer != coordinator:
            with contextlib.suppress(Exception):  # undecodable: answered in order
                header = decode(env.frames[0], job)
        if header is not None and header.get("o") == Data.PUSH and isinstance(header.get("c"), int):
            run.append((env.peer, env.frames, header))
            continue
        out.extend(sorted(run, key=lambda m: m[2]["c"]))  # type: ignore[index]
        run = []
        out.append((env.peer, env.frames, header))
    out.extend(sorted(run, key=lambda m: m[2]["c"]))  # type: ignore[index]
    return out
