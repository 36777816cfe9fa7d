"""The peer trimtab is compared against: ``torch.distributed``'s gloo allreduce.

torch is imported only inside the functions (and the spawned workers) that need it."""

from __future__ import annotations

import datetime
import math
import os
import queue
import statistics
import time
import traceback
from collections.abc import Sequence
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue as MpQueue
from typing import TYPE_CHECKING, Any

from trimtab_tools.bench.baselines.common import HOST, STARTUP_S, free_port, reap, spawn_context

__all__ = ["gloo_allreduce_s"]

if TYPE_CHECKING:
    import torch

# Issue every tensor's allreduce with ``async_op=True`` and wait on all handles at
# the end of the step, rather than one blocking call after another. Measured on a
# 2-core dev box (2 ranks, 4 x 25 MiB float32, 10 steps, 4 interleaved runs):
# async 87.9 ms median per step, sequential 101.6 ms; async won every run.
_GLOO_ASYNC = True


def _check_allreduced(tensors: Sequence[torch.Tensor], expected: float) -> None:
    """Raise ``ValueError`` unless every element of every tensor equals ``expected``."""
    for i, t in enumerate(tensors):
        bad = (t != expected).nonzero()
        if bad.numel() > 0:
            idx = int(bad[0, 0])
            raise ValueError(
                f"allreduce verification failed: tensor {i} (numel {t.numel()}) has "
                f"{bad.shape[0]} wrong element(s); element {idx} is {float(t[idx])}, "
                f"expected {expected}"
            )


def _gloo_worker(
    rank: int,
    world_size: int,
    port: int,
    numels: list[int],
    warmup: int,
    repeats: int,
    verify: bool,
    use_async: bool,
    inject_fault: bool,
    timeout_s: float,
    results: MpQueue[tuple[int, str, Any]],
) -> None:
    """Spawned gloo rank. Puts ``(rank, "ok", times | None)`` or ``(rank, "error", tb)``."""
    try:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        os.environ["MASTER_ADDR"] = HOST
        os.environ["MASTER_PORT"] = str(port)
        import torch
        import torch.distributed as dist

        dist.init_process_group(
            backend="gloo",
            init_method=f"tcp://{HOST}:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            # Rank r contributes r + 1, so the sum is world_size * (world_size + 1) / 2:
            # a no-op, a broadcast or a max/avg would all be caught.
            tensors = [torch.full((n,), float(rank + 1), dtype=torch.float32) for n in numels]
            expected = world_size * (world_size + 1) / 2

            def step() -> None:
                if use_async:
                    handles = [
                        dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True) for t in tensors
                    ]
                    for h in handles:
                        if h is not None:
                            h.wait()
                else:
                    for t in tensors:
                        dist.all_reduce(t, op=dist.ReduceOp.SUM)

            times: list[float] = []
            for i in range(warmup + repeats):
                # Fresh inputs each step (untimed), as gradients would be; this also
                # keeps values from growing by world_size per step towards inf.
                for t in tensors:
                    t.fill_(float(rank + 1))
                t0 = time.perf_counter()
                step()
                dt = time.perf_counter() - t0
                if i == 0 and verify:
                    if inject_fault and rank == 0:
                        tensors[0][-1] += 1.0  # test hook: simulate a wrong reduction
                    _check_allreduced(tensors, expected)
                if i >= warmup:
                    times.append(dt)
        finally:
            dist.destroy_process_group()
        results.put((rank, "ok", times if rank == 0 else None))
    except Exception:
        # Reported to the parent, which raises it; exit non-zero without a second
        # traceback on stderr.
        results.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1) from None


def gloo_allreduce_s(
    tensor_numels: list[int],
    repeats: int = 10,
    world_size: int = 2,
    *,
    verify: bool = True,
    timeout_s: float | None = None,
    _inject_fault: bool = False,
) -> dict[str, float]:
    """Time a gloo allreduce step over ``world_size`` local processes.

    Spawns ``world_size`` processes that join a ``torch.distributed`` gloo group
    on 127.0.0.1 (``GLOO_SOCKET_IFNAME=lo``), each holding float32 tensors of
    ``tensor_numels`` elements. One step is a SUM allreduce of every tensor
    (issued asynchronously, then all handles waited on: ~13% faster than
    sequential blocking calls here). Inputs are refilled, untimed, before each
    step. After 2 warm-up steps, ``repeats`` steps are timed on rank 0.

    Blocks for the spawn and ``import torch`` in every process (~1.5-3 s on a
    2-core host) plus ``repeats + 2`` steps (~90 ms per step for 4 x 25 MiB with 2
    ranks on a 2-core host). Memory: the tensors, in each process.

    Args:
        tensor_numels: element count of each tensor in a step.
        repeats: timed steps.
        world_size: number of processes (ranks).
        verify: after the first warm-up step, check every element equals the
            expected sum (rank ``r`` contributes ``r + 1``).
        timeout_s: limit for the gloo group and for the whole run after startup;
            ``None`` picks ``60 + (repeats + 2) * total_bytes / 20e6`` seconds.
        _inject_fault: test hook; corrupts rank 0's result before verification.

    Returns:
        ``{"median_s": median step time, "min_s": fastest step, "steps": repeats}``.

    Raises:
        ValueError: on empty/non-positive ``tensor_numels``, ``repeats < 1`` or
            ``world_size < 2``.
        RuntimeError: if any rank fails (including a verification failure, whose
            message says "allreduce verification failed"), exits without
            reporting, or the run exceeds its timeout. A store port lost to another
            process between picking and binding it (EADDRINUSE) is retried once
            with a fresh port. All processes are reaped (terminated if needed)
            before this returns or raises.
    """
    if not tensor_numels or any(n <= 0 for n in tensor_numels):
        raise ValueError(f"tensor_numels must be non-empty and positive: {tensor_numels}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1: {repeats}")
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2: {world_size}")
    warmup = 2
    total_bytes = 4 * sum(tensor_numels)
    if timeout_s is None:
        timeout_s = 60.0 + (repeats + warmup) * total_bytes / 20e6
    # The free port is only free until another process takes it: retry once with a
    # fresh one if the store could not bind it.
    attempts = 2
    for attempt in range(attempts):
        try:
            times = _run_gloo(
                world_size,
                free_port(),
                list(tensor_numels),
                warmup,
                repeats,
                verify,
                _inject_fault,
                timeout_s,
            )
            break
        except RuntimeError as exc:
            if attempt + 1 == attempts or "EADDRINUSE" not in str(exc):
                raise
    if len(times) != repeats or not all(math.isfinite(t) for t in times):
        raise RuntimeError(f"gloo allreduce: rank 0 returned bad timings: {times}")
    return {"median_s": statistics.median(times), "min_s": min(times), "steps": repeats}


def _collect_gloo(
    procs: Sequence[SpawnProcess],
    results: MpQueue[tuple[int, str, Any]],
    deadline: float,
    limit_s: float,
) -> list[float]:
    """Wait for every rank's report; return rank 0's times or raise ``RuntimeError``.

    After the first failure (an error report, or a rank that exited without
    reporting) the other ranks get a short grace to report too, so the message
    carries the root cause even when a peer's secondary error ("connection closed
    by peer") arrives first.
    """
    world_size = len(procs)
    reported: set[int] = set()
    failures: dict[int, str] = {}
    times: list[float] | None = None
    grace_end: float | None = None
    timed_out = False
    while len(reported) < world_size:
        now = time.monotonic()
        if grace_end is not None and now > grace_end:
            break
        if now > deadline:
            timed_out = True
            break
        try:
            rank, status, payload = results.get(timeout=0.25)
        except queue.Empty:
            silent = any(p.exitcode is not None for r, p in enumerate(procs) if r not in reported)
            if silent and grace_end is None:
                grace_end = time.monotonic() + 2.0
            continue
        reported.add(rank)
        if status == "ok":
            if rank == 0:
                times = payload
        else:
            failures[rank] = payload
            if grace_end is None:
                grace_end = time.monotonic() + 2.0
    if failures or len(reported) < world_size:
        what = f"timed out after {limit_s:.0f} s" if timed_out else "failed"
        missing = {r: p.exitcode for r, p in enumerate(procs) if r not in reported}
        msg = f"gloo allreduce {what}; failed rank(s): {sorted(failures)}"
        if missing:
            msg += f"; rank(s) without a report (exitcode, None = still running): {missing}"
        for r, tb in sorted(failures.items()):
            msg += f"\n--- rank {r} ---\n{tb}"
        raise RuntimeError(msg)
    if times is None:
        raise RuntimeError("gloo allreduce: rank 0 reported no timings")
    return times


def _run_gloo(
    world_size: int,
    port: int,
    numels: list[int],
    warmup: int,
    repeats: int,
    verify: bool,
    inject_fault: bool,
    timeout_s: float,
) -> list[float]:
    """Spawn the ranks, collect rank 0's step times, and always reap the processes."""
    ctx = spawn_context()
    results: MpQueue[tuple[int, str, Any]] = ctx.Queue()
    procs = [
        ctx.Process(
            target=_gloo_worker,
            args=(
                rank,
                world_size,
                port,
                numels,
                warmup,
                repeats,
                verify,
                _GLOO_ASYNC,
                inject_fault,
                timeout_s,
                results,
            ),
            name=f"trimtab-gloo-rank{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    ok = False
    try:
        for p in procs:
            p.start()
        limit_s = STARTUP_S + timeout_s
        times = _collect_gloo(procs, results, time.monotonic() + limit_s, limit_s)
        ok = True
    finally:
        # On failure the surviving ranks may be blocked in a collective: don't wait.
        reap(procs, 10.0 if ok else 0.5)
    return times
