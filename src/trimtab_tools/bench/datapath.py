"""``trimtab bench datapath``: trimtab's push+pull step against the machine's limits.

In one run it measures, for the same bytes:
  * trimtab: 2 workers x 2 servers, each step pushes every tensor's gradient and
    receives the updated values (real processes, real sockets, the real optimizer path);
  * the loopback TCP ceiling: raw socket transfer between two processes;
  * torch.distributed gloo allreduce of the same tensors with 2 processes;
  * with ``--peers mxnet``, MXNet 1.9.1's ``dist_sync`` KVStore (2 workers x 2 servers,
    push then pull, SGD on the servers), from a venv of its own made on first use,
    over TCP (``mxnet_step_s``) and in ps-lite's one-machine mode (``DMLC_LOCAL=1``:
    Unix-domain sockets, ``mxnet_ipc_step_s``);
  * with ``--peers lean``, the lean PS (``baselines.leanps``: the same step in plain
    Python over pyzmq, every byte through TCP; ``lean_step_s``), against the job with
    every byte through TCP (``step_sockets_over_lean``: what trimtab's own layers cost);
  * small messages: trimtab round trips of one 1 KiB tensor (1 worker, 1 server; a step
    is a push and the wait for the updated value) against raw pyzmq REQ/REP round trips
    of the same 1 KiB between two processes.
A waiting worker or server polls for up to ``TRIMTAB_SPIN_US`` before it sleeps, which
``trimtab run`` sets where the job's processes fit the cores (here the 1 KiB job's 1 + 1
on 2 cores: ``small_spin_us``; not the 2 x 2 job's: ``spin_us``);
``small_no_spin_ops_per_s`` is the 1 KiB job with ``TRIMTAB_SPIN_US=0``. The raw echoes
block in ZeroMQ (``zmq_rtt_per_s``, the issue's baseline); ``zmq_polling_per_s`` is the
raw REQ/REP with the same polling on both sides, so that the trick is not counted as
trimtab's alone. ``small_busy_ops_per_s`` and ``small_busy_no_spin_ops_per_s`` time the
1 KiB job, with and without polling, while one other process keeps a core busy (a
machine shared with a user the job does not know of: polling must not cost there).
``floor_step_s`` = 4 x model bytes / ceiling: the bytes a PS step moves through loopback
(2 workers each push and pull the model once). ``step_cores_busy``: the machine's cores
busy over the job's timed steps (every role shares them).

Between processes of one machine, trimtab moves chunks over 4 KiB through the workers'
shared memory (``trimtab.transport.shm``), where the sockets' floor does not bound it, and its
messages over the local lane (Unix-domain sockets, ``trimtab.transport.lane``): ``step_s``
is that default path, ``step_no_lane_s`` the same job with ZeroMQ for the messages
(``TRIMTAB_LANE=0``; ``small_no_lane_ops_per_s`` likewise), ``step_sockets_s`` with
``TRIMTAB_SHM=0`` (every byte through TCP, as between machines), and
``shm_floor_step_s`` = 4 x model bytes / one core's memcpy rate (each worker's gradient
copied in, its value copied out).

``--replicas 1`` runs only the 100 MiB trimtab job, without and with replicas,
interleaved (:mod:`trimtab_tools.bench.replicas`).

``--observe compare`` runs only the 100 MiB trimtab job, with the live view off and on
(viewed), interleaved (:mod:`trimtab_tools.bench.observe`); ``--trace compare`` likewise
untraced and traced (:mod:`trimtab_tools.bench.tracecost`).

``--grads compare`` runs only the 100 MiB trimtab job, its script reading every
``.grad`` after each step or not, interleaved (:mod:`trimtab_tools.bench.grads`).

``--testbed`` runs the trimtab job (and ``--peers mxnet,lean``) with each role on its own
host of a test bed, over TCP, against that bed's raw TCP floor
(:mod:`trimtab_tools.bench.bed`).

``--auth compare`` runs only the trimtab jobs, with authentication on, off and encrypted
(:mod:`trimtab_tools.bench.auth`). ``--profile DIR`` runs only the trimtab job, under
:mod:`trimtab_tools.bench.profile` (with ``--testbed``, on the bed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from trimtab_tools.bench.baselines import (
    gloo_allreduce_s,
    memcpy_gbps,
    tcp_ceiling_gbps,
    zmq_rtt_per_s,
)
from trimtab_tools.bench.job import busy_process, run_trimtab

MIB = 1 << 20
PEERS = ("mxnet", "lean")
#: The small-message figure: one tensor of 256 float32.
SMALL_BYTES = 1024


#: Rounds of the 1 KiB measurements (trimtab, REQ/REP, framed echo), medians reported.
SMALL_ROUNDS = 3


def model_sizes(total_mib: int) -> list[int]:
    """Tensor sizes in bytes, 1 to 25 MiB, summing to ``total_mib`` MiB."""
    pattern = [25, 20, 16, 12, 10, 8, 5, 2, 1, 1]
    sizes: list[int] = []
    left = total_mib
    while left > 0:
        for mib in pattern:
            take = min(mib, left)
            if take > 0:
                sizes.append(take * MIB)
                left -= take
    return sizes


def _mxnet(
    sizes: list[int], steps: int, venv: Path, install: bool, local: bool = False
) -> tuple[dict[str, Any] | None, str | None]:
    """The MXNet peer's figures (``local``: in ps-lite's one-machine mode), or ``None``
    and why it was skipped. Blocks; never raises for a peer that cannot run (that is a
    skip, said on stderr)."""
    from trimtab_tools.bench.mxnet_peer import ToolUnavailable, mxnet_python, run_mxnet

    try:
        python, _ = mxnet_python(venv, install=install)
    except ToolUnavailable as exc:
        why = f"MXNet unavailable: {exc}"
    else:
        try:
            return run_mxnet(python, sizes, steps, local=local), None
        except RuntimeError as exc:
            why = f"MXNet run failed: {exc}"
    print(f"trimtab bench datapath: skipping the MXNet peer. {why}", file=sys.stderr, flush=True)
    return None, why.splitlines()[0]


def measure(
    steps: int,
    model_mib: int,
    chunk_bytes: int,
    *,
    peers: tuple[str, ...] = (),
    mxnet_venv: Path | None = None,
    install: bool = True,
    small_steps: int = 2000,
    compression: str = "none",
) -> dict[str, Any]:
    """Run every measurement, one after the other. Blocks (about 80 s; the first
    ``--peers mxnet`` run also downloads MXNet). Raises RuntimeError if trimtab or a
    baseline fails; a peer that cannot run is skipped, with the reason in the result."""
    sizes = model_sizes(model_mib)
    total = sum(sizes)
    mxnet: dict[str, Any] | None = None
    mxnet_ipc: dict[str, Any] | None = None
    mxnet_skipped: str | None = "not asked for (--peers mxnet)"
    if "mxnet" in peers:
        from trimtab_tools.bench.mxnet_peer import default_venv

        # The venv first, so that no install runs beside a measurement.
        venv = mxnet_venv or default_venv()
        mxnet, mxnet_skipped = _mxnet(sizes, steps, venv, install)
        if mxnet is not None:
            # ps-lite's own one-machine transport (DMLC_LOCAL: Unix-domain sockets), the
            # peer's counterpart of trimtab's shared memory.
            mxnet_ipc, _ = _mxnet(sizes, steps, venv, install, local=True)
    lean = None
    if "lean" in peers:
        from trimtab_tools.bench.baselines.leanps import run_lean

        lean = run_lean(sizes, steps, chunk_bytes)  # over TCP on loopback
    info: dict[str, Any] = {}
    times = run_trimtab(sizes, steps, chunk_bytes, compression=compression, info=info)
    # The same job with every byte through TCP, as across machines; and with shared
    # memory but ZeroMQ for the messages (what the local lane saves).
    sockets = run_trimtab(sizes, steps, chunk_bytes, compression=compression, shm=False)
    no_lane = run_trimtab(sizes, steps, chunk_bytes, compression=compression, lane=False)
    # The 1 KiB figures swing by 2x within minutes here, each of them: three rounds of
    # the trimtab job and both raw echoes, one right after the other, and the medians.
    rounds: dict[str, list[float]] = {
        "small": [],
        "small_no_spin": [],
        "small_no_lane": [],
        "small_busy": [],
        "small_busy_no_spin": [],
        "zmq": [],
        "zmq_polling": [],
        "framed": [],
    }
    small_info: dict[str, Any] = {}
    for _ in range(SMALL_ROUNDS):
        for key, lane, spin, busy in (
            ("small", True, True, False),
            ("small_no_spin", True, False, False),
            ("small_no_lane", False, True, False),
            ("small_busy", True, True, True),
            ("small_busy_no_spin", True, False, True),
        ):
            with busy_process() if busy else contextlib.nullcontext():
                small = run_trimtab(
                    [SMALL_BYTES],
                    small_steps,
                    chunk_bytes,
                    1,
                    1,
                    warmup=100,
                    compression=compression,
                    lane=lane,
                    spin=spin,
                    info=small_info if key == "small" else None,
                )
            rounds[key].append(len(small) / sum(small))
        rounds["zmq"].append(zmq_rtt_per_s(SMALL_BYTES, small_steps, warmup=100)["per_s"])
        # As long as the trimtab job polled (0 if it did not: then the same as "zmq").
        small_spin_s = float(small_info.get("spin_us") or 0.0) / 1e6
        rounds["zmq_polling"].append(
            zmq_rtt_per_s(SMALL_BYTES, small_steps, warmup=100, spin_s=small_spin_s)["per_s"]
        )
        rounds["framed"].append(
            zmq_rtt_per_s(SMALL_BYTES, small_steps, warmup=100, framed=True)["per_s"]
        )
    small_ops = statistics.median(rounds["small"])
    small_no_lane = statistics.median(rounds["small_no_lane"])
    small_no_spin = statistics.median(rounds["small_no_spin"])
    small_busy = statistics.median(rounds["small_busy"])
    small_busy_no_spin = statistics.median(rounds["small_busy_no_spin"])
    zmq_per_s = statistics.median(rounds["zmq"])
    zmq_polling = statistics.median(rounds["zmq_polling"])
    framed_per_s = statistics.median(rounds["framed"])
    ceiling = tcp_ceiling_gbps(total, repeats=5)
    memcpy = memcpy_gbps(total, repeats=5)
    gloo = gloo_allreduce_s([b // 4 for b in sizes], repeats=max(5, steps // 2))
    step_s = statistics.median(times)
    sockets_s = statistics.median(sockets)
    no_lane_s = statistics.median(no_lane)
    floor = 4 * total / ceiling["bytes_per_s"]
    # Through shared memory a step needs at least 4 model-sized copies (each worker's
    # gradient in, its value out) where the sockets moved 4 models' bytes.
    shm_floor = 4 * total / memcpy["bytes_per_s"]
    mx = mxnet["median_s"] if mxnet else None
    return {
        "benchmark": "datapath",
        "model_bytes": total,
        "tensors": len(sizes),
        "workers": 2,
        "servers": 2,
        "chunk_bytes": chunk_bytes,
        "compression": compression,
        "steps": len(times),
        "step_s": round(step_s, 5),
        "step_p90_s": round(sorted(times)[int(0.9 * (len(times) - 1))], 5),
        "tcp_ceiling_gbps": round(ceiling["gbps"], 3),
        "floor_step_s": round(floor, 5),
        "gloo_allreduce_s": round(gloo["median_s"], 5),
        "step_over_floor": round(step_s / floor, 3),
        "step_over_gloo": round(step_s / gloo["median_s"], 3),
        "shared_memory": bool(info.get("shared_pushes")),
        "step_cores_busy": round(info["cores_busy"], 2) if info.get("cores_busy") else None,
        "spin_us": info.get("spin_us"),
        "step_no_lane_s": round(no_lane_s, 5),
        "step_over_no_lane": round(step_s / no_lane_s, 3),
        "step_sockets_s": round(sockets_s, 5),
        "step_sockets_over_floor": round(sockets_s / floor, 3),
        "step_sockets_over_mxnet": round(sockets_s / mx, 3) if mx else None,
        "memcpy_gbps": round(memcpy["gbps"], 3),
        "shm_floor_step_s": round(shm_floor, 5),
        "step_over_shm_floor": round(step_s / shm_floor, 3),
        "mxnet_step_s": round(mxnet["median_s"], 5) if mxnet else None,
        "mxnet_step_p90_s": round(mxnet["p90_s"], 5) if mxnet else None,
        "step_over_mxnet": round(step_s / mxnet["median_s"], 3) if mxnet else None,
        "mxnet_ipc_step_s": round(mxnet_ipc["median_s"], 5) if mxnet_ipc else None,
        "step_over_mxnet_ipc": round(step_s / mxnet_ipc["median_s"], 3) if mxnet_ipc else None,
        "mxnet_version": mxnet["version"] if mxnet else None,
        "mxnet_bigarray_bound": mxnet["bigarray_bound"] if mxnet else None,
        "mxnet_skipped": mxnet_skipped,
        "lean_step_s": round(lean["median_s"], 5) if lean else None,
        "step_sockets_over_lean": round(sockets_s / lean["median_s"], 3) if lean else None,
        "small_bytes": SMALL_BYTES,
        "small_steps": len(small),
        "small_rounds": SMALL_ROUNDS,
        "small_ops_per_s": round(small_ops, 1),
        "small_no_lane_ops_per_s": round(small_no_lane, 1),
        "small_over_no_lane": round(small_ops / small_no_lane, 3),
        "small_spin_us": small_info.get("spin_us"),
        "small_no_spin_ops_per_s": round(small_no_spin, 1),
        "small_over_no_spin": round(small_ops / small_no_spin, 3),
        "small_busy_ops_per_s": round(small_busy, 1),
        "small_busy_no_spin_ops_per_s": round(small_busy_no_spin, 1),
        "small_busy_over_no_spin": round(small_busy / small_busy_no_spin, 3),
        "zmq_rtt_per_s": round(zmq_per_s, 1),
        "small_over_zmq": round(small_ops / zmq_per_s, 3),
        "zmq_polling_per_s": round(zmq_polling, 1),
        "small_over_zmq_polling": round(small_ops / zmq_polling, 3),
        "zmq_framed_per_s": round(framed_per_s, 1),
        "small_over_framed": round(small_ops / framed_per_s, 3),
        "small_rounds_per_s": {k: [round(v, 1) for v in vs] for k, vs in rounds.items()},
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``trimtab bench datapath``. Reads TRIMTAB_MXNET_VENV (the edge)."""
    from trimtab_tools.bench.mxnet_peer import default_venv

    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--steps", type=int, default=20, help="timed steps (20)")
    p.add_argument("--model-mib", type=int, default=100)
    p.add_argument("--chunk-bytes", type=int, default=1 << 20)
    p.add_argument(
        "--peers",
        default="",
        help="comma-separated peers to run too: mxnet (MXNet 1.9.1 dist_sync KVStore), "
        "lean (the same step in plain Python over pyzmq: what trimtab's own layers cost)",
    )
    p.add_argument(
        "--mxnet-venv",
        type=Path,
        default=default_venv(),
        help="the MXNet venv, made on first use (TRIMTAB_MXNET_VENV; %(default)s)",
    )
    p.add_argument(
        "--no-install",
        action="store_true",
        help="never install a peer or py-spy: skip what is not there",
    )
    p.add_argument(
        "--compression",
        default="none",
        choices=("none", "fp16", "bf16"),
        help="trimtab's gradients on the wire (none); the floor stays the uncompressed one",
    )
    p.add_argument("--small-steps", type=int, default=2000, help="1 KiB round trips timed (2000)")
    p.add_argument(
        "--auth",
        choices=("on", "compare"),
        default="on",
        help="on: the job authenticated, as every job is (default); compare: only the "
        "trimtab jobs, with authentication on, off and --encrypt, interleaved, and ratios",
    )
    p.add_argument(
        "--replicas",
        type=int,
        choices=(0, 1),
        default=0,
        help="1: only the 100 MiB job, without and with --replicas 1, interleaved, and the ratio",
    )
    p.add_argument(
        "--grads",
        choices=("compare",),
        default=None,
        help="compare: only the 100 MiB job, its script reading every .grad after each "
        "step or not, interleaved, and the ratio",
    )
    p.add_argument(
        "--observe",
        choices=("compare",),
        default=None,
        help="compare: only the 100 MiB job, with the dashboard, /metrics and the run record "
        "off and on (viewed), interleaved, and the ratio",
    )
    p.add_argument(
        "--trace",
        choices=("compare",),
        default=None,
        help="compare: only the 100 MiB job, untraced and with --trace, interleaved, and the ratio",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="with --auth, --grads, --observe or --trace compare, or --replicas: rounds (3)",
    )
    p.add_argument(
        "--testbed",
        action="store_true",
        help="each role on its own host of a test bed (root): the step over TCP between "
        "hosts against the bed's raw TCP floor, with --peers on the same hosts",
    )
    p.add_argument(
        "--rate-mbit",
        type=float,
        default=None,
        help="with --testbed: shape every host's link to this rate (tc tbf)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="profile the trimtab job's timed steps instead (py-spy + per-thread CPU); "
        "with --testbed, on the bed",
    )
    p.add_argument(
        "--profile-small",
        action="store_true",
        help="with --profile: the 1 KiB round trips (1 worker, 1 server, --small-steps)",
    )


def main(args: argparse.Namespace) -> int:
    peers = tuple(p for p in args.peers.split(",") if p)
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        print(f"trimtab bench datapath: unknown peer(s) {unknown}; known: {PEERS}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.small_steps < 1:
        print("trimtab bench datapath: --steps and --small-steps must be >= 1", file=sys.stderr)
        return 2
    if args.profile is not None:
        from trimtab_tools.bench.profile import profile_datapath, render  # only with --profile

        if args.profile_small:
            shape: dict[str, Any] = {"workers": 1, "servers": 1, "warmup": 100}
            sizes, steps = [SMALL_BYTES], args.small_steps
        else:
            shape, sizes, steps = {}, model_sizes(args.model_mib), args.steps
        with contextlib.ExitStack() as stack:
            if args.testbed:
                from trimtab_tools.bench.bed import HOSTS, shaped_bed

                try:
                    shape["testbed"] = stack.enter_context(shaped_bed(HOSTS, args.rate_mbit))
                except RuntimeError as exc:
                    print(f"trimtab bench datapath: {exc}", file=sys.stderr)
                    return 1
            summary = profile_datapath(
                args.profile, sizes, steps, args.chunk_bytes, install=not args.no_install, **shape
            )
        print(json.dumps(summary) if args.json else render(summary), flush=True)
        return 0
    if args.observe == "compare":
        from trimtab_tools.bench.observe import measure_observe

        result = measure_observe(
            model_sizes(args.model_mib), args.steps, args.chunk_bytes, args.rounds
        )
        print(json.dumps(result) if args.json else json.dumps(result, indent=1), flush=True)
        return 0
    if args.trace == "compare":
        from trimtab_tools.bench.tracecost import measure_trace

        result = measure_trace(
            model_sizes(args.model_mib), args.steps, args.chunk_bytes, args.rounds
        )
        print(json.dumps(result) if args.json else json.dumps(result, indent=1), flush=True)
        return 0
    if args.grads == "compare":
        from trimtab_tools.bench.grads import measure_grads

        result = measure_grads(
            model_sizes(args.model_mib), args.steps, args.chunk_bytes, args.rounds
        )
        print(json.dumps(result) if args.json else json.dumps(result, indent=1), flush=True)
        return 0
    if args.replicas:
        from trimtab_tools.bench.replicas import measure_replicas

        result = measure_replicas(
            model_sizes(args.model_mib), args.steps, args.chunk_bytes, args.replicas, args.rounds
        )
        print(json.dumps(result) if args.json else json.dumps(result, indent=1), flush=True)
        return 0
    if args.testbed:
        from trimtab_tools.bench.bed import measure_datapath, mxnet_runner

        sizes = model_sizes(args.model_mib)
        runner = None
        if "mxnet" in peers:
            runner = mxnet_runner(sizes, args.steps, args.mxnet_venv, not args.no_install)
        try:
            result = measure_datapath(
                sizes,
                args.steps,
                args.chunk_bytes,
                compression=args.compression,
                rate_mbit=args.rate_mbit,
                mxnet=runner,
                lean="lean" in peers,
            )
        except RuntimeError as exc:
            print(f"trimtab bench datapath: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(result) if args.json else json.dumps(result, indent=1), flush=True)
        return 0
    if args.auth == "compare":
        from trimtab_tools.bench.auth import measure_auth

        result = measure_auth(
            model_sizes(args.model_mib),
            args.steps,
            args.chunk_bytes,
            SMALL_BYTES,
            args.small_steps,
            rounds=args.rounds,
        )
        print(json.dumps(result) if args.json else json.dumps(result, indent=1), flush=True)
        return 0
    result = measure(
        args.steps,
        args.model_mib,
        args.chunk_bytes,
        peers=peers,
        mxnet_venv=args.mxnet_venv,
        install=not args.no_install,
        small_steps=args.small_steps,
        compression=args.compression,
    )
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0
