"""Where a chunk leaving this server is cut: the clock from which its new owner holds it.

The cut is the round in progress if no push of it can come here any more without being
answered *moved*, else the next one. A round some worker pushed to is under way: it
completes here (its value is answered) before the chunk goes. Under BSP (which live
migration needs) every worker pushes every chunk of a table in each step, so a round
under way on one chunk of a table is under way on all of them, pushed or not yet: they
are cut after it too. Cut at the round in progress instead, the step's pushes that were
on their way when the new map came were all answered *moved* and sent again, and the
step paid for the round trips (issue 20's migration pause); cut after it, the step runs
as if nothing moved, the chunks go as their round is answered, during the workers'
next compute, and the workers route the next step by the new map (MAP_NEWS).

A round is under way on a table where a push of it is in on one of its chunks here,
*or where one of them completed it already* (its round is past it). A step's pushes
come in chunk after chunk: between one chunk's last push and the next one's first, no
chunk here has a push in, yet the table's round is half done. Read from the pushes in
alone, a map that came then cut the chunks done with the round after it and the rest
at it: some of a server's leaving chunks had the step's pushes answered *moved*, the
others not (issue 38's bed records: 6 of 32 moves of two or more chunks off a server,
e.g. N1 step 1: one of the slow server's six leaving chunks stayed for the step, 12 of
its 32 traffic units, not 8 or 32).

A big move is spread over :data:`SPREAD_STEPS` steps (:func:`spread`): the chunks
leaving a server are cut at successive rounds, a like share of their bytes at each, so
no one step pays for moving them all (issue 20's migration pause: a forced migration of
every chunk of a 32 MiB model, on 2 cores, made its step up to 2 x its neighbours; the
p99 over the median went from 1.9 to 1.7 spread over 4 steps, to 1.3 over 8). The price
is that a big move completes 8 steps after it starts (a straggler's chunks leave it an
eighth a step). A move of at most :data:`SPREAD_MIN_BYTES` goes at once, as PSLD's
moves of a few chunks off a slow server do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trimtab.roles.server.store import Chunk, ChunkStore

#: Steps a big move is spread over (each cut one round after the previous share's).
SPREAD_STEPS = 8

#: Bytes leaving a server at once, at most, before a move is spread.
SPREAD_MIN_BYTES = 4 << 20


def rounds_under_way(store: ChunkStore) -> dict[int, int]:
    """Per table, the latest round under way on a chunk of it here: pushed to (a push
    of it in) or, under a synchronous policy, completed (the round before the chunk's,
    where it has none in: a chunk at round ``k`` completed ``k - 1``). Under BSP no
    chunk of a table starts round ``k + 1`` before every chunk completed ``k`` (a worker
    pushes the next step once every value of this one is in), so a round completed on
    one chunk is the one every chunk still at it is in. Asynchronous rounds are each
    chunk's own (one a push): only pushes in count there. Pure."""
    synchronous = store.consistency.synchronous
    under_way: dict[int, int] = {}
    for chunk in store.chunks.values():
        if chunk.arrived:
            started = chunk.round
        elif synchronous and chunk.round > 0:
            started = chunk.round - 1
        else:
            continue
        table = store.table_of(chunk.spec)
        under_way[table] = max(under_way.get(table, started), started)
    return under_way


def cut_of(chunk: Chunk, table: int, under_way: Mapping[int, int]) -> int:
    """The cut of ``chunk`` (of ``table``): after its round in progress if that round
    is under way, on it or on another chunk of its table (``under_way``, from
    :func:`rounds_under_way`: pushed to, or completed), else at it. Pure."""
    started = bool(chunk.arrived) or under_way.get(table) == chunk.round
    return chunk.round + (1 if started else 0)


def spread(store: ChunkStore, leaving: Sequence[int]) -> dict[int, int]:
    """Per chunk of ``leaving`` (held here, in order), the rounds its cut comes after the
    first: 0 for all if they hold at most :data:`SPREAD_MIN_BYTES`, else 0 to
    ``SPREAD_STEPS - 1``, each value for a like share of their bytes. Pure."""
    sizes = [store.chunks[c].spec.nbytes for c in leaving]
    total = sum(sizes)
    if total <= SPREAD_MIN_BYTES:
        return dict.fromkeys(leaving, 0)
    out: dict[int, int] = {}
    before = 0
    for cid, size in zip(leaving, sizes, strict=True):
        out[cid] = before * SPREAD_STEPS // total
        before += size
    return out
