"""``trimtab bench msgcost``: the CPU one chunk of a step costs trimtab's worker and
server, beside the lean PS's, measured where the machine's noise reaches it least.

The data path's step on the test bed is bound by CPU (2 cores for 4 processes), and its
step time moves by up to 2 x between runs with the machine's load, which hides a change
of a few percent. This measures the same work per chunk as CPU time instead: one worker
and one server as threads of this process, over ZeroMQ TCP on 127.0.0.1 (no local lane,
no shared memory), with P3's credit of one chunk each way, as on the bed. Chunks of
``--chunk-bytes`` (16 KiB: above the size that travels inside the header, small enough
that torch's arithmetic is a few us) make the per-message work, not the bytes, the cost.
Then the lean PS (:mod:`~trimtab_tools.bench.baselines.leanps`) runs the same steps, its
server a thread of this process too. Rounds alternate between the two.

Per chunk, in us of CPU (``/proc/self/task/*/stat``, over the timed steps):

* ``worker_us``: the worker's Python threads (the training thread; trimtab's credit
  and I/O threads too);
* ``server_us``: the server's thread;
* ``other_us``: the rest of the process: ZeroMQ's I/O threads, pyzmq's garbage
  collector, trimtab's coordinator (nearly idle);
* ``wall_us``: the step's wall time per chunk (two threads sharing one GIL: read the CPU).

With ``--processes``, each server (trimtab's coordinator and server, or the lean PS's
server) runs in a process of its own instead, so that the two roles share no GIL: as on
the bed, where each role is a process. ``server_us`` is then that process's Python
threads (the server's, pyzmq's garbage collector, trimtab's idle coordinator), and
``other_us`` ZeroMQ's I/O threads of both processes and the worker's rest.

``--auth on`` (the default, as every user's job: ``trimtab run`` and ``init()`` make
or read the job's secret, and run without it only with ``--no-auth``/``TRIMTAB_AUTH=0``)
gives trimtab's roles a job key: each connection's handshake, a MAC on every header,
and the transport's per-message paths with a key. ``--auth off`` runs them without one
(insecure), which before 2026-11-29 was the only measure (``"auth": false`` in its JSON).
The lean PS has no authentication in either. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["add_arguments", "main", "measure"]

#: Tensors of the model, and chunks per tensor: 100 chunks a step, as the bed's 100 MiB.
TENSORS = 4
CHUNKS_PER_TENSOR = 25
#: Untimed steps first (connections, torch's first calls).
WARMUP = 20
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_by_thread(pid: int | str = "self") -> dict[str, float]:
    """CPU seconds (user + kernel) of each live thread of process ``pid`` (this
    one by default), by ``name:tid`` (the Python thread's name where it is this
    process's, else the kernel's). Never blocks."""
    names = {th.native_id: th.name for th in threading.enumerate()} if pid == "self" else {}
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid)) or stat[stat.index("(") + 1 : stat.rindex(")")]
        out[f"{name}:{tid}"] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _process_cpu() -> float:
    """CPU seconds of the whole process, ended threads included. Never blocks."""
    t = os.times()
    return t.user + t.system


def _split(
    before: dict[str, float], after: dict[str, float], total: float, worker: set[str], server: str
) -> dict[str, float]:
    """CPU seconds of the worker's threads (names in ``worker``), the server's thread
    (``server``) and the rest of ``total`` (the process's), between two snapshots."""

    def of(pred: Callable[[str], bool]) -> float:
        return sum(v - before.get(k, 0.0) for k, v in after.items() if pred(k.split(":")[0]))

    w, s = of(lambda n: n in worker), of(lambda n: n == server)
    return {"worker": w, "server": s, "other": max(0.0, total - w - s)}


def _key(secret: bytes | None) -> Any:
    """The job's key made of ``secret``, 32 random bytes (``None``: no authentication)."""
    from trimtab.transport.auth import JobKey

    return None if secret is None else JobKey(secret)


def _start_roles(
    job: str, chunk_bytes: int, secret: bytes | None = None
) -> tuple[Any, Any, Any, Any]:
    """trimtab's coordinator and server for one worker, as threads of this process:
    ``(coordinator, its thread, server, its thread)``; with ``secret``, authenticated
    (and their server key derived from it, as ``trimtab coordinator``/``server`` do).
    Blocks briefly."""
    from trimtab.roles.coordinator.config import CoordinatorConfig
    from trimtab.roles.coordinator.node import Coordinator
    from trimtab.roles.server.config import ServerConfig
    from trimtab.roles.server.node import Server
    from trimtab.transport import ZmqTransport

    key = _key(secret)
    server_key = b"" if key is None else key.derive(b"server join")
    coord = Coordinator(
        CoordinatorConfig(
            num_workers=1, num_servers=1, job=job, chunk_bytes=chunk_bytes, server_key=server_key
        ),
        ZmqTransport(bind=True, lane=False, auth=key),
    )
    coord_thread = coord.start()
    server = Server(
        ServerConfig(coordinator=coord.address, job=job, server_key=server_key),
        ZmqTransport(bind=True, lane=False, auth=key),
    )
    return coord, coord_thread, server, server.start()


def _stop_roles(coord: Any, coord_thread: Any, server: Any, server_thread: Any) -> None:
    """Wait for :func:`_start_roles`' roles to end with the job (its worker is done);
    stop them if they do not. Blocks up to 20 s."""
    for thread in (server_thread, coord_thread):
        thread.join(10.0)
    if coord_thread.is_alive() or server_thread.is_alive():
        coord.abort("trimtab bench msgcost is over")
        server.stop()


def _worker_steps(
    address: str,
    job: str,
    chunk_bytes: int,
    steps: int,
    mark: Callable[[], None],
    secret: bytes | None = None,
) -> float:
    """The worker: :data:`WARMUP` steps, ``mark()``, ``steps`` timed steps, ``mark()``;
    then it checks the SGD result and leaves the job (which ends it); with ``secret``,
    authenticated. Returns the timed steps' wall seconds. Blocks; raises
    ``RuntimeError`` if the result is wrong."""
    import torch

    import trimtab
    from trimtab import Context, WorkerConfig
    from trimtab.transport import ZmqTransport

    config = WorkerConfig(
        coordinator=address,
        job=job,
        rank=0,
        shared_memory=False,
        credit_bytes=-1,  # one chunk in flight each way: the default of a real job
    )
    ctx = Context(config, transport=ZmqTransport(bind=False, lane=False, auth=_key(secret)))
    try:
        numel = CHUNKS_PER_TENSOR * chunk_bytes // 4
        params = [torch.nn.Parameter(torch.zeros(numel)) for _ in range(TENSORS)]
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(params, lr=0.1),
            [(f"t{i}", p) for i, p in enumerate(params)],
            context=ctx,
        )
        grad = torch.full((numel,), 1e-3)

        def step() -> None:
            for p in params:
                p.grad = grad
            opt.step()

        for _ in range(WARMUP):
            step()
        mark()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - started
        mark()
        want = -0.1 * 1e-3 * (WARMUP + steps)
        if abs(params[0][0].item() - want) > 1e-6 + 1e-4 * abs(want):
            raise RuntimeError(f"trimtab's step went wrong: {params[0][0].item()} != {want}")
    finally:
        ctx.close()  # the job's only worker is done: the coordinator ends the job
    return wall


#: A :func:`_worker_steps` mark's snapshot: this process's threads' CPU, its own CPU.
Snapshot = tuple[dict[str, float], float]


def _snapshots(into: list[Snapshot], server_pid: int | None = None) -> Callable[[], None]:
    """A mark that appends this process's CPU by thread and in all (and, with
    ``server_pid``, that process's: :func:`_child_snapshot`) to ``into``."""

    def mark() -> None:
        into.append((_cpu_by_thread(), _process_cpu()))
        if server_pid is not None:
            into.append(_child_snapshot(server_pid))

    return mark


_WORKER_THREADS = {"MainThread", "trimtab-credit", "trimtab-io"}


def _trimtab_round(chunk_bytes: int, steps: int, auth: bool = True) -> dict[str, float]:
    """One timed run of trimtab's roles (``auth``: with a job key); CPU seconds by part
    and wall seconds."""
    job, secret = uuid.uuid4().hex[:8], (os.urandom(32) if auth else None)
    roles = _start_roles(job, chunk_bytes, secret)
    marks: list[Snapshot] = []
    try:
        wall = _worker_steps(roles[0].address, job, chunk_bytes, steps, _snapshots(marks), secret)
    finally:
        _stop_roles(*roles)
    (before, total), (after, total_after) = marks
    cpu = _split(before, after, total_after - total, _WORKER_THREADS, "trimtab-server")
    return {**cpu, "wall": wall}


def _lean_worker(port: int, chunk_bytes: int, steps: int) -> tuple[float, float]:
    """The lean PS's worker against its server at ``port``, all ``steps`` timed: its
    thread's CPU seconds and the wall seconds. Blocks; raises ``RuntimeError`` if the
    lean PS fails."""
    from trimtab_tools.bench.baselines import leanps

    sizes = [CHUNKS_PER_TENSOR * chunk_bytes] * TENSORS
    worker, started = time.thread_time(), time.perf_counter()
    try:
        leanps._work([f"tcp://127.0.0.1:{port}"], 0, sizes, chunk_bytes, steps, 0)
    except SystemExit as exc:  # (its roles end their process on a failure)
        raise RuntimeError(f"the lean PS failed: {exc}") from None
    return time.thread_time() - worker, time.perf_counter() - started


def _lean_round(chunk_bytes: int, steps: int) -> dict[str, float]:
    """One run of the lean PS (its server a thread), all of it timed (its workers time
    no warm-up apart); as :func:`_trimtab_round`. Its threads end with the run, so each
    measures its own CPU (``time.thread_time``), and ZeroMQ's are the process's rest."""
    from trimtab_tools.bench.baselines import leanps

    sizes = [CHUNKS_PER_TENSOR * chunk_bytes] * TENSORS
    ports: list[int] = []
    ready = threading.Event()
    server_cpu: list[float] = []

    def serve() -> None:
        started = time.thread_time()
        try:
            leanps._serve("127.0.0.1", 0, 1, 1, sizes, chunk_bytes, announce)
        finally:
            server_cpu.append(time.thread_time() - started)

    def announce(port: int) -> None:
        ports.append(port)
        ready.set()

    thread = threading.Thread(target=serve, name="leanps-server", daemon=True)
    total = _process_cpu()
    thread.start()
    if not ready.wait(60.0):
        raise RuntimeError("the lean PS's server did not start")
    worker, wall = _lean_worker(ports[0], chunk_bytes, steps)
    thread.join(30.0)
    if not server_cpu:
        raise RuntimeError("the lean PS's server did not finish")
    total = _process_cpu() - total
    return {
        "worker": worker,
        "server": server_cpu[0],
        "other": max(0.0, total - worker - server_cpu[0]),
        "wall": wall,
    }


def _cpu_of(pid: int) -> float:
    """CPU seconds of process ``pid``, its ended threads included. Never blocks."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _child_cpu(pid: int, since: Snapshot, until: Snapshot | None = None) -> tuple[float, float]:
    r"""CPU seconds of server process ``pid`` between two :func:`_child_snapshot`\ s
    (``until``: now): its Python threads', and the rest (ZeroMQ's threads, kernel names
    ``ZMQbg/...``, counted even where they ended: the lean PS's server closes its
    context first)."""
    before, total = since
    after, total_after = until or _child_snapshot(pid)
    py = sum(v - before.get(k, 0.0) for k, v in after.items() if not k.startswith("ZMQbg"))
    return py, max(0.0, total_after - total - py)


def _child_snapshot(pid: int) -> Snapshot:
    """What :func:`_child_cpu` counts from. Never blocks."""
    return _cpu_by_thread(pid), _cpu_of(pid)


def _trimtab_serve(
    out: Any, done: Any, job: str, chunk_bytes: int, secret: bytes | None = None
) -> None:
    """A process's body: trimtab's coordinator and server until the job ends (with
    ``secret``, authenticated); the coordinator's address goes to ``out`` (a queue).
    Blocks."""
    import torch

    torch.set_num_threads(1)
    roles = _start_roles(job, chunk_bytes, secret)
    out.put(roles[0].address)
    done.wait(600.0)  # (the parent reads this process's CPU first)
    _stop_roles(*roles)


def _lean_serve(out: Any, done: Any, chunk_bytes: int) -> None:
    """A process's body: the lean PS's server for one worker; its port goes to
    ``out``. Waits for ``done`` before it exits (the parent reads its CPU). Blocks."""
    import torch

    from trimtab_tools.bench.baselines import leanps

    torch.set_num_threads(1)
    sizes = [CHUNKS_PER_TENSOR * chunk_bytes] * TENSORS
    leanps._serve("127.0.0.1", 0, 1, 1, sizes, chunk_bytes, out.put)
    done.wait(600.0)


def _in_process(target: Callable[..., None], *args: Any) -> tuple[Any, Any, Any, Any]:
    """Start ``target(out, done, *args)`` in a new (spawned) process; return it, what it
    put in ``out`` first, and ``done`` (set to let it exit). Blocks until it says."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    out, done = spawn.Queue(), spawn.Event()
    proc = spawn.Process(target=target, args=(out, done, *args), daemon=True)
    proc.start()
    try:
        first = out.get(timeout=120.0)
    except Exception:
        proc.kill()
        raise RuntimeError("msgcost's server process did not start") from None
    return proc, first, done, out


def _trimtab_round_processes(chunk_bytes: int, steps: int, auth: bool = True) -> dict[str, float]:
    """As :func:`_trimtab_round`, its coordinator and server in another process."""
    job, secret = uuid.uuid4().hex[:8], (os.urandom(32) if auth else None)
    proc, address, done, _ = _in_process(_trimtab_serve, job, chunk_bytes, secret)
    marks: list[Snapshot] = []
    try:
        wall = _worker_steps(address, job, chunk_bytes, steps, _snapshots(marks, proc.pid), secret)
        server_py, server_zmq = _child_cpu(proc.pid, marks[1], marks[3])
    finally:
        done.set()
        proc.join(30.0)
        if proc.is_alive():
            proc.kill()
    (before, total), (after, total_after) = marks[0], marks[2]
    worker = _split(before, after, total_after - total, _WORKER_THREADS, "-")
    return {
        "worker": worker["worker"],
        "server": server_py,
        "other": worker["other"] + server_zmq,
        "wall": wall,
    }


def _lean_round_processes(chunk_bytes: int, steps: int) -> dict[str, float]:
    """As :func:`_lean_round`, its server in another process."""
    proc, port, done, _ = _in_process(_lean_serve, chunk_bytes)
    try:
        server_before = _child_snapshot(proc.pid)
        total = _process_cpu()
        worker, wall = _lean_worker(port, chunk_bytes, steps)
        total = _process_cpu() - total
        time.sleep(0.2)  # (its server's last messages: the BYEs)
        server_py, server_zmq = _child_cpu(proc.pid, server_before)
    finally:
        done.set()
        proc.join(30.0)
        if proc.is_alive():
            proc.kill()
    return {
        "worker": worker,
        "server": server_py,
        "other": max(0.0, total - worker) + server_zmq,
        "wall": wall,
    }


def measure(
    chunk_bytes: int = 16384,
    steps: int = 300,
    rounds: int = 3,
    *,
    processes: bool = False,
    auth: bool = True,
) -> dict[str, Any]:
    """Run ``rounds`` rounds of trimtab's roles and of the lean PS, alternating; return
    the medians per chunk (us) and the ratios. Blocks for the runs (about 10 s a round
    at the defaults). ``processes``: each server in a process of its own; ``auth``:
    trimtab's roles with a job key (as a user's job), else without (insecure). Raises
    ``RuntimeError`` if a run fails, ``ValueError`` for arguments out of range."""
    if steps < 1 or rounds < 1 or chunk_bytes < 8192 or chunk_bytes % 4:
        raise ValueError("need steps >= 1, rounds >= 1, chunk_bytes >= 8192 and a multiple of 4")
    import torch

    torch.set_num_threads(1)
    chunks = steps * TENSORS * CHUNKS_PER_TENSOR
    runs: dict[str, list[dict[str, float]]] = {"trimtab": [], "lean": []}
    trimtab_round = _trimtab_round_processes if processes else _trimtab_round
    lean_round = _lean_round_processes if processes else _lean_round
    for _ in range(rounds):
        runs["trimtab"].append(trimtab_round(chunk_bytes, steps, auth))
        runs["lean"].append(lean_round(chunk_bytes, WARMUP + steps))
    lean_chunks = (WARMUP + steps) * TENSORS * CHUNKS_PER_TENSOR

    def per_chunk(which: str, n: int) -> dict[str, float]:
        return {
            f"{part}_us": round(statistics.median(r[part] for r in runs[which]) / n * 1e6, 1)
            for part in ("worker", "server", "other", "wall")
        }

    tt, lean = per_chunk("trimtab", chunks), per_chunk("lean", lean_chunks)
    return {
        "benchmark": "msgcost",
        "chunk_bytes": chunk_bytes,
        "chunks_per_step": TENSORS * CHUNKS_PER_TENSOR,
        "steps": steps,
        "rounds": rounds,
        "auth": auth,
        "processes": processes,
        "trimtab": tt,
        "lean": lean,
        "worker_over_lean": round(tt["worker_us"] / lean["worker_us"], 2),
        "server_over_lean": round(tt["server_us"] / lean["server_us"], 2),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--steps", type=int, default=300, help="timed steps a round (300)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating (3)")
    p.add_argument("--chunk-bytes", type=int, default=16384, help="chunk size (16384)")
    p.add_argument(
        "--processes",
        action="store_true",
        help="each server in a process of its own (no GIL shared with the worker)",
    )
    p.add_argument(
        "--auth",
        choices=("on", "off"),
        default="on",
        help="trimtab's roles with the job's key, as a user's job (on, the default), or "
        "without (off: insecure, the measure before 2026-11-29); the lean PS has none",
    )


def main(args: argparse.Namespace) -> int:
    try:
        result = measure(
            args.chunk_bytes,
            args.steps,
            args.rounds,
            processes=getattr(args, "processes", False),
            auth=getattr(args, "auth", "on") == "on",
        )
    except (ValueError, RuntimeError) as exc:
        print(f"trimtab bench msgcost: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    if args.json:
        print(json.dumps(result))
        return 0
    for which in ("trimtab", "lean"):
        parts = ", ".join(f"{k[:-3]} {v:.1f}" for k, v in result[which].items())
        print(f"{which:>8}: us per chunk: {parts}")
    print(
        f"worker / lean {result['worker_over_lean']:.2f}, "
        f"server / lean {result['server_over_lean']:.2f}"
    )
    return 0
