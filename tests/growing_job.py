"""The job of the growing-table test, and a model of what its servers must count.

Both workers read the same ids at each step (bags of one id, ``mode="sum"``: each bag
is its row), so a bucket sees each step's ids twice, in the same order whichever
worker reads first: the counters are a function of the schedule alone, which
:func:`expected` computes with the pure policy (policies/growth.py).
"""

from __future__ import annotations

import torch

ROWS = 64
DIM = 4
CHUNK_BYTES = 64  # 16 chunks of 4 whole rows: 16 buckets
SEED = 7  # the table's values
BASE = 1 << 62  # ids far beyond the table's rows

#: Ids of three phases, each a set no other shares.
A = [BASE + 977 * k for k in range(16)]
B = [-(BASE + 31 * k) for k in range(1, 17)]
C = [12345678901 * k for k in range(1, 25)]
#: Each step's ids: A, then B, then C (past the cap: rows given back), then A again
#: (unseen past the time to live: evicted; read again, they come back as new rows).
SCHEDULE = [A, A, B, B, C, C, A, A, A]


def growth():  # type: ignore[no-untyped-def]
    from trimtab.nn import Growth

    return Growth(admit_after=2, ttl_steps=3, max_rows=40)


def expected() -> tuple[dict[str, int], list[dict[int, tuple[int, bool]]]]:
    """The servers' counters summed at the end, and per step each id's row as the
    second read of it sees it (-1: refused) and whether that read gave it afresh."""
    from trimtab.frontend.growing import bucket_of
    from trimtab.policies.growth import COUNTERS, RowMap, caps

    g = growth()
    shares = caps(g.max_rows, [4] * 16)
    maps = [RowMap(g, range(4 * b, 4 * b + 4), shares[b]) for b in range(16)]
    per_step = []
    for step, ids in enumerate(SCHEDULE):
        keys = torch.tensor(sorted(ids))
        which = bucket_of(keys, 16)
        seen: dict[int, tuple[int, bool]] = {}
        for b, m in enumerate(maps):
            mine = keys[which == b].tolist()
            if not mine:
                continue
            m.see(mine, step)
            rows, fresh = m.see(mine, step)
            for k, r in zip(mine, rows, strict=True):
                seen[k] = (r, r in fresh)
        per_step.append(seen)
    total = dict.fromkeys((*COUNTERS, "live"), 0)
    for m in maps:
        for k, v in m.counters().items():
            total[k] += v
    return total, per_step
