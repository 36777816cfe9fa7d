"""The data path across hosts: ``trimtab bench datapath --testbed`` and the bed that
``trimtab bench overlap --testbed`` runs on.

A test bed of :data:`HOSTS` hosts (network namespaces on a bridge,
:mod:`trimtab.launch.testbed`) runs the datapath job of ``bench datapath`` (2 workers x
2 servers, 100 MiB), each role on its own host as ``trimtab run --testbed`` lays them
out (:mod:`trimtab.launch.hosts`): every byte crosses the bed's links by TCP, as between
machines. In the same run, between the same hosts, one raw TCP stream from a worker's
host to a server's host (:meth:`Testbed.tcp_stream`) gives the bed's floor:
``floor_step_s`` = 4 x model bytes / that rate (the median of :data:`RATE_ROUNDS`
streams), as the loopback floor of ``bench datapath`` is. The bed's hosts share the
machine's cores, so the JSON also says how many cores one raw stream kept busy
(``tcp_cores_busy``) and how many the job's timed steps did (``step_cores_busy``, of
``cores``): a step that keeps every core busy is bound by the CPU. Its floor there,
``cpu_floor_step_s``, is the CPU the step cannot do without, spread over the cores: the
kernel's for the step's bytes (``tcp_cores_busy`` x ``floor_step_s``: one raw stream's
CPU per byte) and the merge, update and copies of any synchronous PS step
(``arith_cpu_s``, :func:`~trimtab_tools.bench.baselines.ps_arithmetic_cpu_s`);
``step_over_cpu_floor`` is what trimtab's own CPU (Python, per message) adds. With
``--peers mxnet``, MXNet's ``dist_sync`` runs on the same hosts, each process where
trimtab's role of the same kind runs; with ``--peers lean``, so does the lean PS
(:mod:`~trimtab_tools.bench.baselines.leanps`: the same step in plain Python over pyzmq,
nothing else): ``step_over_lean`` is what trimtab's own layers cost a step, and
``lean_over_floor`` how near the floor Python and ZeroMQ alone come. With
``--rate-mbit R`` every host's link is shaped to R by ``tc`` (``tbf``) first.

Needs root or ``CAP_NET_ADMIN`` (:func:`trimtab.launch.testbed.unavailable` says why
not); the bed is removed before this returns, whatever happens.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trimtab.launch.cores import available_cores
from trimtab.launch.hosts import Layout, place
from trimtab.launch.tcprate import Stream
from trimtab.launch.testbed import Testbed, unavailable
from trimtab_tools.bench.baselines import ps_arithmetic_cpu_s
from trimtab_tools.bench.baselines.leanps import run_lean
from trimtab_tools.bench.job import run_trimtab

__all__ = ["HOSTS", "measure_datapath", "shaped_bed"]

#: The bed's hosts: the coordinator and server 0 on host 0, server 1 on host 1, the
#: workers on hosts 2 and 3.
HOSTS = 4
#: Raw TCP rate measurements between the two hosts (one before the job, the rest after);
#: the median is the floor's rate. One stream's rate moves from run to run by up to 2 x
#: on a shared 2-core machine (where the sender and the receiver run), hence five.
RATE_ROUNDS = 5


@contextlib.contextmanager
def shaped_bed(hosts: int = HOSTS, rate_mbit: float | None = None) -> Iterator[Testbed]:
    """A bed of ``hosts`` hosts, each link shaped to ``rate_mbit`` if given; removed on
    exit. Blocks to make and remove it. Raises RuntimeError (with the reason) where this
    process cannot make one, :class:`~trimtab.launch.testbed.TestbedError` if ``ip``/``tc``
    fail."""
    why = unavailable()
    if why is not None:
        raise RuntimeError(f"no test bed here: {why}")
    with Testbed(hosts) as bed:
        if rate_mbit:
            for host in range(hosts):
                bed.shape(host, rate_mbit=rate_mbit)
        yield bed


def _stream(bed: Testbed, layout: Layout) -> Stream:
    """One raw TCP stream from worker 0's host to server 0's. Blocks ~1 s."""
    worker, server = layout.worker(0), layout.server(0)
    assert worker is not None and server is not None
    return bed.tcp_stream(worker.index, server.index, seconds=1.0)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def measure_datapath(
    sizes: list[int],
    steps: int,
    chunk_bytes: int,
    *,
    compression: str = "none",
    rate_mbit: float | None = None,
    mxnet: Callable[[Layout], tuple[dict[str, Any] | None, str | None]] | None = None,
    lean: bool = False,
) -> dict[str, Any]:
    """The datapath step on a bed, its floor, (``mxnet``: a function that runs the
    MXNet peer on a layout, or says why not) MXNet's step on the same hosts, and
    (``lean``) the lean PS's (:mod:`~trimtab_tools.bench.baselines.leanps`). Blocks for
    the jobs (about a minute, more with MXNet); raises RuntimeError if trimtab's job or
    the lean PS's fails, or no bed can be made here."""
    total = sum(sizes)
    arith_s = ps_arithmetic_cpu_s(total, chunk_bytes, workers=2)
    info: dict[str, Any] = {}
    streams: list[Stream] = []
    peer: dict[str, Any] | None = None
    lean_run: dict[str, Any] | None = None
    skipped: str | None = "not asked for (--peers mxnet)"
    with shaped_bed(HOSTS, rate_mbit) as bed:
        layout = place(bed.hosts, 2, 2)
        print(f"trimtab bench datapath: on the test bed {bed.id}", file=sys.stderr, flush=True)
        streams.append(_stream(bed, layout))
        times = run_trimtab(
            sizes, steps, chunk_bytes, compression=compression, info=info, testbed=bed
        )
        if lean:
            lean_run = run_lean(sizes, steps, chunk_bytes, layout=layout)
        if mxnet is not None:
            peer, skipped = mxnet(layout)
        streams.extend(_stream(bed, layout) for _ in range(RATE_ROUNDS - 1))
    rates = [s.bytes_per_s for s in streams]
    rate = statistics.median(rates)
    step_s = statistics.median(times)
    floor = 4 * total / rate
    cores = available_cores()
    tcp_busy = _median([s.cores_busy for s in streams])
    cpu_floor = (tcp_busy * floor + arith_s) / cores if tcp_busy is not None else None
    mx = peer["median_s"] if peer else None
    lean_s = lean_run["median_s"] if lean_run else None
    return {
        "benchmark": "datapath",
        "testbed": True,
        "hosts": HOSTS,
        "rate_mbit": rate_mbit,
        "model_bytes": total,
        "tensors": len(sizes),
        "workers": 2,
        "servers": 2,
        "chunk_bytes": chunk_bytes,
        "compression": compression,
        "steps": len(times),
        "step_s": round(step_s, 5),
        "step_p90_s": round(sorted(times)[int(0.9 * (len(times) - 1))], 5),
        "tcp_ceiling_gbps": round(rate * 8 / 1e9, 3),
        "tcp_rates_mb_per_s": [round(r / 1e6, 1) for r in rates],
        "floor_step_s": round(floor, 5),
        "step_over_floor": round(step_s / floor, 3),
        "cores": cores,
        "tcp_cores_busy": _round(tcp_busy, 2),
        "step_cores_busy": _round(info.get("cores_busy"), 2),
        "arith_cpu_s": round(arith_s, 5),
        "cpu_floor_step_s": _round(cpu_floor, 5),
        "step_over_cpu_floor": round(step_s / cpu_floor, 3) if cpu_floor else None,
        "shared_memory": bool(info.get("shared_pushes")),
        "mxnet_step_s": round(mx, 5) if mx else None,
        "mxnet_step_p90_s": round(peer["p90_s"], 5) if peer else None,
        "step_over_mxnet": round(step_s / mx, 3) if mx else None,
        "mxnet_floor_over": round(mx / floor, 3) if mx else None,
        "mxnet_version": peer["version"] if peer else None,
        "mxnet_skipped": skipped,
        "lean_step_s": round(lean_s, 5) if lean_s else None,
        "step_over_lean": round(step_s / lean_s, 3) if lean_s else None,
        "lean_over_floor": round(lean_s / floor, 3) if lean_s else None,
    }


def mxnet_runner(
    sizes: list[int], steps: int, venv: Path, install: bool
) -> Callable[[Layout], tuple[dict[str, Any] | None, str | None]]:
    """What :func:`measure_datapath` calls to run the MXNet peer on a layout: its
    figures, or ``None`` and why it was skipped (said on stderr). The venv is made (or
    found missing) at once, before any measurement; the job runs when called."""
    from trimtab_tools.bench.mxnet_peer import ToolUnavailable, mxnet_python, run_mxnet

    try:
        python, _ = mxnet_python(venv, install=install)
    except ToolUnavailable as exc:
        why = f"MXNet unavailable: {exc}"
        print(f"trimtab bench datapath: skipping the MXNet peer. {why}", file=sys.stderr)
        return lambda layout: (None, why.splitlines()[0])

    def run(layout: Layout) -> tuple[dict[str, Any] | None, str | None]:
        try:
            return run_mxnet(python, sizes, steps, layout=layout), None
        except RuntimeError as exc:
            why = f"MXNet run failed: {exc}"
            print(f"trimtab bench datapath: skipping the MXNet peer. {why}", file=sys.stderr)
            return None, why.splitlines()[0]

    return run
