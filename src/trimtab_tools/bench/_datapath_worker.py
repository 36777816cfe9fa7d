"""Worker script of ``trimtab bench datapath``: times push+pull steps of a synthetic model.

Every step each worker hands the servers a gradient for every tensor (as backward would)
and waits for the updated values (plain SGD on the servers): the whole real path. With
``--read-grads`` the script then reads every parameter's ``.grad`` (the mean gradient,
fetched from the servers on that read), within the timed step.
Rank 0 prints one result line after a marker: its step times, and the machine's cores
busy over its timed steps (``cores_busy``: with every role on one machine, whether the
step is bound by the cores).

With ``--go-file`` (the profiler's handshake), rank 0 prints :data:`READY` after the
warm-up, waits for that file to exist before its timed steps, and prints :data:`DONE`
right after them; the other ranks need no handshake to start (their first timed push
waits for rank 0's: bsp). Then every rank waits for the profiler's second file
(:func:`~trimtab_tools.bench.markers.read_file`) before it goes on to shut down, so that
the profiler reads the counters of every thread still running.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import trimtab
import trimtab.frontend.api
from trimtab.frontend.compression import Compression, compressor
from trimtab.launch.cores import cores_busy, machine_cpu
from trimtab.transport.spin import spin_from_env
from trimtab_tools.bench.markers import DONE, READY, RESULT, read_file

LR = 0.1
GRAD = 1e-3


def _timed_step(
    optimizer: trimtab.DistributedOptimizer, read: list[torch.nn.Parameter] | None = None
) -> float:
    # One function around the timed work, so a profile can keep exactly these samples.
    # ``read``: the parameters whose .grad the script reads after step() (Horovod's
    # mean gradient, fetched from the servers on that read).
    start = time.perf_counter()
    optimizer.step()
    for p in read or ():
        _ = p.grad
    return time.perf_counter() - start


def _await(go_file: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not go_file.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{go_file} did not appear within {timeout_s:.0f}s")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="comma-separated tensor sizes in bytes")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--go-file", type=Path, help="rank 0 waits for it before timing")
    parser.add_argument(
        "--read-grads", action="store_true", help="read every .grad after each step, timed"
    )
    args = parser.parse_args()

    trimtab.init()
    params = [torch.nn.Parameter(torch.zeros(int(b) // 4)) for b in args.sizes.split(",")]
    grads = [torch.full_like(p, GRAD) for p in params]
    optimizer = trimtab.DistributedOptimizer(
        torch.optim.SGD(params, lr=LR),
        named_parameters=[(f"t{i}", p) for i, p in enumerate(params)],
    )
    lead = trimtab.rank() == 0
    times = []
    cpu, started = machine_cpu(), time.perf_counter()
    for step in range(args.warmup + args.steps):
        if step == args.warmup and lead and args.go_file is not None:
            print(READY, flush=True)
            _await(args.go_file, 120.0)
        if step == args.warmup:
            cpu, started = machine_cpu(), time.perf_counter()
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        elapsed = _timed_step(optimizer, params if args.read_grads else None)
        if step >= args.warmup:
            times.append(elapsed)
    busy = cores_busy(cpu, machine_cpu(), time.perf_counter() - started)
    if args.go_file is not None:
        if lead:
            print(DONE, flush=True)
        _await(read_file(args.go_file), 120.0)
    # The update must have happened: every element moved by lr * mean gradient per step
    # (float32 sums of many steps drift by a few ulps, hence the relative slack).
    # (With --compression the gradient travels rounded to fp16 / bf16.)
    wire = Compression.none
    if trimtab.is_initialized():
        wire = compressor(trimtab.frontend.api.default_context().compression)
    grad = torch.tensor(GRAD).to(wire.wire_dtype(torch.float32)).item()
    expected = -LR * grad * (args.warmup + args.steps)
    got = params[0][0].item()
    if abs(got - expected) > 1e-6 + 1e-4 * abs(expected):
        raise SystemExit(f"datapath produced wrong values: {got} != {expected}")
    if args.read_grads and any(
        p.grad is None or not torch.allclose(p.grad, torch.full_like(p, grad)) for p in params
    ):
        raise SystemExit("datapath read a .grad other than the mean gradient")
    if lead:
        # How many pushes the servers read from shared memory (0: all through sockets).
        shared = sum(int(s.get("shared", 0)) for s in trimtab.server_stats())
        # How long a wait polled before sleeping (trimtab run's choice, or the user's).
        spin_us = spin_from_env(os.environ) * 1e6
        print(
            RESULT
            + json.dumps(
                {"times": times, "shared_pushes": shared, "spin_us": spin_us, "cores_busy": busy}
            ),
            flush=True,
        )
    trimtab.shutdown()


if __name__ == "__main__":
    main()
