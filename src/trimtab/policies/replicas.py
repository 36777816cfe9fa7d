"""Where each chunk's backup lives (``--replicas 1``): a pure function of the owners.

Whatever placement policy chose the owners (hash, mxnet, greedy, psld), the backups
are chosen here, after it, so no policy can put a chunk and its backup on one server:
:func:`backups` never gives a chunk's backup to its owner, and balances the bytes each
server backs up. :func:`failover` is the map after a server's death: its chunks go to
their backups, and every chunk left without a backup (its backup died, or was just
promoted) gets a new one on another live server. :func:`role_moves` is a step of live
placement: chunks move only onto their backups, so every chunk is held twice throughout.
:func:`unbacked` names the chunks held once (the last live server's, after failovers):
a server that joins then gives them a backup again (a role move that changes backups only).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

#: A backup table's entry for a chunk without a backup.
NONE = -1

#: With speeds known (PSLD), a server slower than this share of the fastest keeps no
#: backup: a round's values wait for its backup's acknowledgement, so a slow backup
#: stalls its chunks as a slow owner would.
SLOW_BACKUP = 0.5


def backups(
    owners: Sequence[int],
    sizes: Sequence[int],
    live: Collection[int],
    keep: Sequence[int] = (),
    speeds: Sequence[float] | None = None,
) -> list[int]:
    """Each chunk's backup server: another of ``live`` than its owner, the one backing
    up the fewest bytes so far (ties: the lowest index), or :data:`NONE` where no other
    live server exists. ``keep``: a backup table to keep where its entry is still
    valid (live, not the owner); the others are chosen anew. With ``speeds`` (each
    server's measured speed), bytes are weighed by speed, and a server slower than
    :data:`SLOW_BACKUP` of the fastest keeps nothing and gets nothing while another
    server can take it. Pure; never blocks."""
    servers = sorted(live)
    load = dict.fromkeys(servers, 0)
    rate = dict.fromkeys(servers, 1.0)
    if speeds:
        known = [speeds[s] for s in servers if s < len(speeds) and speeds[s] > 0]
        for s in servers:
            if known:
                rate[s] = speeds[s] if s < len(speeds) and speeds[s] > 0 else max(known)
        fastest = max(rate.values(), default=1.0)
        slow = {s for s in servers if rate[s] < SLOW_BACKUP * fastest}
    else:
        slow = set()
    out = [NONE] * len(owners)
    for cid, backup in enumerate(keep[: len(owners)]):
        if backup in load and backup != owners[cid] and backup not in slow:
            out[cid] = backup
            load[backup] += sizes[cid]
    # The biggest chunks first: a greedy balance of bytes (by speed, where known).
    for cid in sorted(range(len(owners)), key=lambda c: -sizes[c]):
        if out[cid] != NONE:
            continue
        candidates = [s for s in servers if s != owners[cid]]
        fast = [s for s in candidates if s not in slow]
        candidates = fast or candidates
        if candidates:
            best = min(candidates, key=lambda s: ((load[s] + sizes[cid]) / rate[s], s))
            out[cid] = best
            load[best] += sizes[cid]
    return out


def role_moves(
    owners: Sequence[int],
    backup_of: Sequence[int],
    wanted: Sequence[int],
    sizes: Sequence[int],
    active: Collection[int],
    speeds: Sequence[float] | None = None,
) -> tuple[list[int], list[int]]:
    """One step of moving chunks to the owners ``wanted`` in a job with replicas, where
    a chunk moves only onto its backup (which holds it): (new owners, new backups).

    A chunk wanted on its backup swaps: the backup owns it, and the old owner backs it
    up if it is still ``active`` (else another server does). A chunk wanted on a third
    server gets that server as its backup now (a fresh copy), to swap onto it in the
    next step. Other chunks keep their backup while it is active and not their owner.
    Chunks wanted where they are stay. With ``speeds`` (PSLD's), backups avoid slow
    servers (see :func:`backups`): a chunk moved off a slow server does not leave it as
    that chunk's backup. Pure; never blocks."""
    new_owners = list(owners)
    keep = list(backup_of[: len(owners)]) + [NONE] * (len(owners) - len(backup_of))
    toward: dict[int, int] = {}  # chunk -> the server it is wanted on, its next backup
    for cid, (owner, want) in enumerate(zip(owners, wanted, strict=True)):
        if want == owner:
            continue
        if want == keep[cid]:
            new_owners[cid], keep[cid] = want, owner
        else:
            keep[cid] = toward[cid] = want
    out = backups(new_owners, sizes, active, keep, speeds)
    for cid, want in toward.items():  # the step toward the wanted owner, slow or not
        if want in active:
            out[cid] = want
    return new_owners, out


def failover(
    owners: Sequence[int],
    backup_of: Sequence[int],
    sizes: Sequence[int],
    dead: int,
    live: Collection[int],
) -> tuple[list[int], list[int], list[int]]:
    """The map after server ``dead`` died: (owners, backups, lost chunks). Each of its
    chunks goes to its backup; a chunk whose backup is missing or dead too is lost (it
    keeps its dead owner in the owners returned). Every chunk then without a valid
    backup gets one among ``live`` (not ``dead``). Pure; never blocks."""
    alive = set(live) - {dead}
    new_owners = list(owners)
    lost = []
    for cid, owner in enumerate(owners):
        if owner != dead:
            continue
        backup = backup_of[cid] if cid < len(backup_of) else NONE
        if backup in alive:
            new_owners[cid] = backup
        else:
            lost.append(cid)
    kept = [NONE if b == dead else b for b in backup_of]
    return new_owners, backups(new_owners, sizes, alive, kept), lost


def unbacked(owners: Sequence[int], backup_of: Sequence[int], live: Collection[int]) -> list[int]:
    """The chunks held once: without a backup on a live server other than their owner
    (:data:`NONE`, their owner, or a server not in ``live``). Pure; never blocks."""
    alive = set(live)
    out = []
    for cid, owner in enumerate(owners):
        backup = backup_of[cid] if cid < len(backup_of) else NONE
        if backup in (NONE, owner) or backup not in alive:
            out.append(cid)
    return out
