"""A server's receipts: the CREDIT that tells a worker a push's bytes arrived (P3).

A worker that bounds its bytes in flight per server marks its pushes ``ak``
(:mod:`trimtab.roles.worker.credit`). The server answers each at once, as it reads the
push off its socket and before it merges or answers any message of the batch, so the
worker's credit never waits for a round to complete: under BSP that would wait for the
other workers' pushes, which may themselves be held back for credit.
"""

from __future__ import annotations

import contextlib

from trimtab.protocol.credit import credit
from trimtab.protocol.messages import Data, decode
from trimtab.roles.server.priority import Queued
from trimtab.runtime.loop import NodeLoop

_PUSH = int(Data.PUSH)


def acknowledge(batch: list[Queued], loop: NodeLoop) -> list[Queued]:
    """Send a CREDIT for each push of ``batch`` that asks for one (``ak``); return the
    batch in the same order, each message with its header decoded (so that it is not
    decoded twice; the coordinator's too, which its handler ignores). A message that
    does not decode is left as it is: it is refused in its turn. Blocks only as
    :meth:`NodeLoop.send` does; never raises for what a peer sent."""
    out: list[Queued] = []
    for peer, frames, header in batch:
        if header is None and frames:
            with contextlib.suppress(Exception):  # undecodable: answered in order
                header = decode(frames[0], loop.job)
        if header is not None and header.get("ak") and header.get("o") == _PUSH:
            rid = header.get("i")
            if isinstance(rid, int) and not isinstance(rid, bool):
                loop.send(peer, credit(rid=rid))
        out.append((peer, frames, header))
    return out
