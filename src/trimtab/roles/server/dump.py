"""What a server says of itself: its protocol state in words, for a hung job's dump
(:data:`STACK_SIGNAL`), and its counters, for tests and the coordinator (STATS)."""

from __future__ import annotations

from typing import Any

from trimtab.roles.server.handover import Handover
from trimtab.roles.server.lifecycle import ChunkPhase
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.replica import Replicas
from trimtab.roles.server.store import ChunkStore


def describe(index: int, state: str, step: int, store: ChunkStore, handover: Handover) -> str:
    """Server ``index`` (in lifecycle ``state``, at ``step``): the chunks with a round in
    progress or on their way out or in, handovers not yet acked. Only reads; never
    blocks."""
    moves = handover.moves
    rounds = [ch.round for ch in store.chunks.values()]
    lines = [
        f"server {index} ({state}): map epoch {store.epoch}, step "
        f"{step}, owns {len(store.chunks)} chunks, rounds "
        f"{min(rounds, default=0)}..{max(rounds, default=0)}"
    ]
    for cid, ch in sorted(store.chunks.items()):
        move = moves.get(cid)
        if ch.arrived or ch.waiting or ch.held or move is not None:
            lines.append(
                f"  chunk {cid}: round {ch.round}, pushed by workers {sorted(ch.arrived)}, "
                f"{len(ch.waiting)} waiting, {len(ch.held)} held"
                + (
                    f", leaving for server {move.owner} from clock {move.cut}"
                    if move is not None
                    else ""
                )
            )
    handed = []
    for cid, move in sorted(moves.items()):
        if move.phase is ChunkPhase.ARRIVING:
            lines.append(f"  chunk {cid}: arriving, {len(move.queued)} requests wait for it")
        elif move.phase is ChunkPhase.HANDED:
            handed.append(cid)
    if handed:
        lines.append(f"  handed over, not yet acked: chunks {handed}")
    if handover.early:
        lines.append(f"  {len(handover.early)} handovers of a map not yet received")
    return "\n".join(lines)


def stats(
    index: int,
    store: ChunkStore,
    replicas: Replicas,
    handover: Handover,
    meter: LoadMeter,
    errors: int,
) -> dict[str, Any]:
    """Server ``index``'s counters and versions (``errors``: the errors it sent). Only
    reads; never blocks."""
    return {
        "index": index,
        "epoch": store.epoch,
        **store.stats(),
        **replicas.stats(),
        "errors": errors,
        "moved_in": handover.moved_in,
        "moved_out": handover.moved_out,
        # HANDOVERs of a map not yet received, held (bounded: handover.EARLY_MAX*).
        "early": len(handover.early),
        "early_bytes": handover.early_bytes,
        "busy_s": meter.busy_s,
        "bytes": meter.bytes,
    }
