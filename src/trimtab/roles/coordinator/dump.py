"""The coordinator's protocol state in words, for a hung job's dump (:data:`STACK_SIGNAL`)."""

from __future__ import annotations

from trimtab.roles.coordinator.collectives import Collectives
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members
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
