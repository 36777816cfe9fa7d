"""Long runs do not grow: what a worker and the coordinator keep stays the same size
over hundreds of migrations and steps (issue 20: a worker grew about 1.7 KB per
migration, and the coordinator's per-step history was never pruned)."""

from __future__ import annotations

import collections
import gc
import logging
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

from tests.conftest import Cluster
from trimtab import Context
from trimtab.frontend.optimizer import DistributedOptimizer
from trimtab.policies.psld import PsldController
from trimtab.transport.inproc import Fabric

#: Steps between which nothing may grow: from past the longest history kept
#: (:data:`~trimtab.roles.coordinator.steps.HISTORY_STEPS`) to 200 steps later.
FIRST, LAST = 60, 260

#: Steps measured at each end; each end's smallest size is compared. What is in flight
#: when a step is measured (a step some worker has not reported yet, a migration under
#: way, a speed window opened again after an idle spell) is bounded but comes and goes:
#: together it once read as 54 objects more at the last step than at the first (a CI
#: run beside the integration tests). A leak is in every measure of the later end.
SAMPLES = 5


#: Where counting stops: shared code and its globals, tensors (their storage is not the
#: point), threads and loggers, and the in-process fabric (messages in flight).
_SHARED = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
    torch.Tensor,
    threading.Thread,
    logging.Logger,
    Fabric,
)


def reachable(*roots: object) -> int:
    """How many objects ``roots`` hold, following references, but not into what
    :data:`_SHARED` lists, nor into a deque with a ``maxlen``: bounded by construction,
    it counts as one object however full. (PSLD's noise figures fill such a deque of 64
    windows per server over some 350 steps here, which read as growth between two
    measurements 200 steps apart.)"""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        if isinstance(obj, collections.deque) and obj.maxlen is not None:
            continue
        stack.extend(gc.get_referents(obj))
    return len(seen)


def test_a_worker_and_the_coordinator_stay_bounded_over_many_migrations(
    cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = cluster_factory(workers=2, servers=2, chunk_bytes=256, rebalance_every=1)
    sizes: dict[str, list[int]] = {"worker": [], "coordinator": [], "migrations": []}
    coordinator = cluster.coordinator

    def measure() -> None:
        gc.collect()
        c: Any = coordinator
        parts = (c._members, c._maps, c._steps, c._rebalancer, c._speeds, c._collectives)
        sizes["coordinator"].append(reachable(*parts, c._liveness))
        sizes["migrations"].append(coordinator.migrations)

    def train(ctx: Context) -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 8)
        opt = DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01),
            model.named_parameters(),
            context=ctx,
        )
        for step in range(LAST + 1):
            if ctx.rank == 0 and (FIRST <= step < FIRST + SAMPLES or step > LAST - SAMPLES):
                # The worker's own state: its context (client, routing, members) and
                # optimizer, without the model.
                sizes["worker"].append(reachable(ctx, opt._pusher, opt._reporter))
                measure()
            opt.zero_grad()
            model(torch.ones(2, 16)).sum().backward()
            opt.step()

    cluster.run_workers(train, timeout_s=300)
    moved = sizes["migrations"][-1] - sizes["migrations"][0]
    assert moved >= 100, sizes  # (forced every step; a few are skipped while one runs)
    # A leak of one object per migration or per step would show as 100 or more.
    for part in ("worker", "coordinator"):
        assert len(sizes[part]) == 2 * SAMPLES, sizes
        first, last = min(sizes[part][:SAMPLES]), min(sizes[part][SAMPLES:])
        assert last - first < 40, (part, sizes)


def test_psld_keeps_a_window_of_step_times() -> None:
    psld = PsldController(min_servers=2)
    for clock in range(10_000):
        psld.observe_step(clock, 0.1)
    kept: dict[int, float] = psld._steps  # type: ignore[attr-defined]
    assert len(kept) <= 4 * psld.window + psld.interval + 1
