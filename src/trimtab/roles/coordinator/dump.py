"""The coordinator's state for people: STATUS's view of the job, and its protocol state
in words for a hung job's dump (:data:`STACK_SIGNAL`). Only reads; never blocks."""

from __future__ import annotations

from typing import Any

from trimtab.policies.psld import SpeedEstimator
from trimtab.roles.coordinator.collectives import Collectives
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members, MemberState
from trimtab.roles.coordinator.rebalance import Rebalancer
from trimtab.roles.coordinator.steps import Steps


def describe(
    maps: Maps, rebalancer: Rebalancer, members: Members, steps: Steps, collectives: Collectives
) -> str:
    """The map, the migration in flight, each worker's clock and map, each server's
    state, the collectives waiting. Only reads; never blocks."""
    mig = rebalancer.migrating
    current = maps.map
    workers = members.workers
    lines = [
        f"coordinator: map epoch {maps.epoch}, published "
        f"{maps.published_epoch or '-'}, {maps.waiting()} map requests "
        f"waiting, workers' clocks {dict(sorted(steps.clocks.items()))}, workers' "
        f"oldest maps { {r: w.floor for r, w in sorted(workers.items())} }"
    ]
    if mig is not None:
        lines.append(
            f"  migration to epoch {mig.epoch}: acks awaited from servers "
            f"{sorted(mig.acks)}, chunks not yet handed over {sorted(mig.moving)}, "
            f"cuts {dict(sorted(mig.cuts.items()))}"
        )
    lines += members.describe(lambda r: current.owners.count(r) if current else 0)
    gathers = collectives.pending()
    if gathers:
        lines.append(f"  collectives waiting (key: ranks arrived): {gathers}")
    return "\n".join(lines)


def status(
    members: Members, maps: Maps, steps: Steps, rebalancer: Rebalancer, speeds: SpeedEstimator
) -> dict[str, Any]:
    """Membership, placement, clocks, migrations and speeds, as STATUS answers them."""
    servers = members.servers
    current = maps.map
    return {
        "servers": [m.addr for m in servers],
        "workers": sorted(members.workers),
        "done": sorted(r for r, m in members.workers.items() if m.finished),
        "left": sorted(r for r, m in members.workers.items() if m.state is MemberState.LEFT),
        "epoch": maps.epoch,
        "owners": list(current.owners) if current else [],
        "clocks": {str(r): c for r, c in steps.clocks.items()},
        "migrations": rebalancer.migrations,
        "bytes_moved": rebalancer.bytes_moved,
        "active_servers": [m.rank for m in members.active_servers()],
        "live_servers": [m.rank for m in servers if not m.finished],
        "wanted_servers": members.wanted_servers(),
        "migrating": rebalancer.migrating is not None,
        # With replicas: each chunk's backup (-1: none), the chunks held once.
        "backups": list(maps.backups),
        "unbacked": len(rebalancer.unbacked()),
        "speeds": [speeds.speed(m.rank) for m in servers],
        # The workers' bounds (lower, upper or None for no bound) per server.
        "worker_speeds": [
            None
            if (b := speeds.observed(m.rank)) is None
            else [b[0], b[1] if b[1] != float("inf") else None]
            for m in servers
        ],
    }
