"""What a :class:`~trimtab.frontend.pusher.Pusher` says in a hung job's dump (SIGUSR1,
:mod:`trimtab.runtime.diagnostics`): its chunk requests not yet answered, and the
last one its training thread waited for."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any

from trimtab.roles.worker.context import Context

# A chunk's push in flight as the pusher keeps it (its Sent): the reply's future, the
# header, the frames and the server it went to.
_Sent = tuple[concurrent.futures.Future[Any], Mapping[str, Any], Any, int]


def unanswered(
    inflight: Mapping[Any, Sequence[_Sent]],
    arriving: Mapping[Any, tuple[Sequence[_Sent], int]],
    awaited: tuple[int, int, int | None] | None,
    ctx: Context,
) -> str:
    """The dump's lines: ``inflight`` (this step's pushes by parameter), ``arriving``
    (those sent, answers not written: by parameter, with their clock) and ``awaited``
    (chunk, request id, clock of the last request waited for). Only reads; never
    blocks."""
    open_ = [
        f"chunk {header['c']} (clock {clock}, request {header.get('i')}) sent to server "
        f"{owner}" + (f" [{type(f.exception()).__name__}]" if f.done() else "")
        for futs, clock in arriving.values()
        for f, header, _, owner in futs
        if not f.done() or f.exception() is not None
    ]
    lines = [f"{len(inflight)} tensors pushed this step, {len(arriving)} awaiting values"]
    if awaited is not None:
        cid, rid, clock = awaited
        where = ctx.server_of(cid, clock) if ctx.placement else "?"
        lines.append(f"  last waited for: chunk {cid}, request {rid}, at {where}")
    lines.extend(f"  unanswered: {u}" for u in open_[:20])
    if len(open_) > 20:
        lines.append(f"  ... and {len(open_) - 20} more")
    return "\n".join(lines)
