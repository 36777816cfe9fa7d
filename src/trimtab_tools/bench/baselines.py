"""Physical and peer baselines for trimtab's datapath benchmark.

Three figures are measured in the same run as the datapath benchmark so that
trimtab's numbers can be read against them:

* :func:`tcp_ceiling_gbps` -- what one raw TCP stream over loopback moves between
  two processes (the ceiling any socket-based datapath on this host works under);
* :func:`gloo_allreduce_s` -- how long ``torch.distributed`` with the gloo backend
  takes to allreduce a given set of float32 tensors (the peer that trimtab is
  compared against);
* :func:`zmq_rtt_per_s` -- raw pyzmq REQ/REP round trips of a small payload between
  two processes (the ceiling for trimtab's small messages, which also ride ZeroMQ);
  with ``framed=True``, over trimtab's own socket pattern and framing (DEALER/ROUTER,
  a header frame and a payload frame), with nothing else in Python.

All spawn helper processes (``multiprocessing`` "spawn" context), bind and connect
on 127.0.0.1 only, and never hang: every wait has a timeout, and helper processes
that outlive it are terminated. Importing this module has no side effects; torch
is only imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import multiprocessing as mp
import os
import queue
import socket
import statistics
import time
import traceback
from collections.abc import Sequence
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue as MpQueue
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["gloo_allreduce_s", "tcp_ceiling_gbps", "zmq_rtt_per_s"]

_HOST = "127.0.0.1"

# Explicit SO_SNDBUF/SO_RCVBUF for the TCP ceiling; ``None`` keeps the kernel's
# autotuned buffers. Measured on a 2-core dev box (100 MiB, 10 interleaved runs of
# 7 transfers, 1 MiB send / 128 KiB receive chunks): autotune 3.85 GB/s median,
# 4 MiB 3.71, 8 MiB 3.75 -- no difference beyond noise (+-0.5 GB/s). Setting a
# size also turns autotuning off and is capped at net.core.{w,r}mem_max, which can
# be small on other hosts, so the kernel is left alone.
_TCP_SOCKBUF: int | None = None

# Issue every tensor's allreduce with ``async_op=True`` and wait on all handles at
# the end of the step, rather than one blocking call after another. Measured on a
# 2-core dev box (2 ranks, 4 x 25 MiB float32, 10 steps, 4 interleaved runs):
# async 87.9 ms median per step, sequential 101.6 ms; async won every run.
_GLOO_ASYNC = True

# How long a spawned helper may take to start (interpreter + imports) on a busy
# machine before it is declared failed.
_STARTUP_S = 60.0


def _ctx() -> mp.context.SpawnContext:
    return mp.get_context("spawn")


def _free_port() -> int:
    """Return a port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _reap(procs: Sequence[SpawnProcess], timeout_s: float) -> None:
    """Join ``procs`` within ``timeout_s`` in total; terminate, then kill, stragglers."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5.0)
        if p.is_alive():
            p.kill()
            p.join(5.0)


def _tune(sock: socket.socket, sockbuf: int | None) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sockbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)


def _filled(nbytes: int) -> bytearray:
    # Every page written with non-zero bytes, so neither side reads the shared
    # zero page (which would sit in cache and flatter the figure).
    return bytearray(b"\xa5") * nbytes


# --------------------------------------------------------------------------- TCP


def _tcp_receiver(
    port: int,
    nbytes: int,
    transfers: int,
    recv_chunk: int,
    sockbuf: int | None,
    timeout_s: float,
    errors: MpQueue[str],
) -> None:
    """Spawned receiver: connect, take ``transfers`` transfers of ``nbytes``, ack each."""
    try:
        buf = _filled(nbytes)
        view = memoryview(buf)
        with socket.create_connection((_HOST, port), timeout=timeout_s) as sock:
            _tune(sock, sockbuf)
            for _ in range(transfers):
                pos = 0
                while pos < nbytes:
                    got = sock.recv_into(view[pos:], min(recv_chunk, nbytes - pos))
                    if got == 0:
                        raise ConnectionError(f"sender closed after {pos} of {nbytes} bytes")
                    pos += got
                sock.sendall(b"\x01")
            # Wait for the sender to close so it never sees a reset.
            sock.recv(1)
    except Exception:
        # Reported to the parent, which raises it; exit non-zero without a second
        # traceback on stderr.
        errors.put(traceback.format_exc())
        raise SystemExit(1) from None


def _tcp_ceiling(
    nbytes: int,
    repeats: int,
    chunk: int,
    *,
    recv_chunk: int,
    sockbuf: int | None,
    timeout_s: float | None,
) -> dict[str, float]:
    if min(nbytes, repeats, chunk, recv_chunk) <= 0:
        raise ValueError(
            "nbytes, repeats, chunk and recv_chunk must be positive: "
            f"{nbytes}, {repeats}, {chunk}, {recv_chunk}"
        )
    if timeout_s is None:
        # Generous: loopback moves >1 GB/s even on small hosts; allow 50 MB/s.
        timeout_s = 30.0 + nbytes / 50e6
    ctx = _ctx()
    errors: MpQueue[str] = ctx.Queue()
    send_buf = _filled(nbytes)
    view = memoryview(send_buf)
    ack = bytearray(1)
    times: list[float] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as lsock:
        lsock.bind((_HOST, 0))
        lsock.listen(1)
        lsock.settimeout(0.25)
        port = lsock.getsockname()[1]
        proc = ctx.Process(
            target=_tcp_receiver,
            args=(port, nbytes, repeats + 1, recv_chunk, sockbuf, timeout_s, errors),
            name="trimtab-tcp-ceiling-receiver",
            daemon=True,
        )
        proc.start()
        try:
            deadline = time.monotonic() + _STARTUP_S
            conn: socket.socket | None = None
            while conn is None:
                try:
                    conn, _ = lsock.accept()
                except TimeoutError:
                    if not proc.is_alive() or time.monotonic() > deadline:
                        raise RuntimeError(
                            "TCP ceiling: receiver process never connected "
                            f"(exitcode={proc.exitcode})"
                        ) from None
            with conn:
                conn.settimeout(timeout_s)
                _tune(conn, sockbuf)
                for i in range(repeats + 1):  # transfer 0 is the uncounted warm-up
                    t0 = time.perf_counter()
                    for off in range(0, nbytes, chunk):
                        conn.sendall(view[off : off + chunk])
                    if conn.recv_into(ack, 1) != 1:
                        raise ConnectionError("receiver closed before acknowledging")
                    dt = time.perf_counter() - t0
                    if i > 0:
                        times.append(dt)
        except (OSError, RuntimeError) as exc:
            detail = ""
            with contextlib.suppress(queue.Empty):
                detail = "\nreceiver traceback:\n" + errors.get(timeout=2.0)
            raise RuntimeError(f"TCP ceiling measurement failed: {exc!r}{detail}") from exc
        finally:
            _reap([proc], 10.0)
    if proc.exitcode != 0:
        detail = ""
        with contextlib.suppress(queue.Empty):
            detail = "\nreceiver traceback:\n" + errors.get(timeout=2.0)
        raise RuntimeError(f"TCP ceiling: receiver exited with code {proc.exitcode}{detail}")
    seconds = statistics.median(times)
    bytes_per_s = nbytes / seconds
    return {"bytes_per_s": bytes_per_s, "gbps": bytes_per_s * 8 / 1e9, "seconds": seconds}


def memcpy_gbps(nbytes: int, repeats: int = 5) -> dict[str, float]:
    """Measure one core copying ``nbytes`` between two preallocated, touched buffers
    (``numpy.copyto``): the limit of a path that moves bytes through shared memory.
    Blocks for ``repeats + 1`` copies (~0.1 s for 100 MiB). Returns ``{"bytes_per_s",
    "gbps", "seconds"}`` of the median copy."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    times = []
    for i in range(repeats + 1):
        started = time.perf_counter()
        np.copyto(dst, src)
        if i:  # the first copy is a warm-up
            times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return {"bytes_per_s": nbytes / seconds, "gbps": nbytes * 8 / seconds / 1e9, "seconds": seconds}


def tcp_ceiling_gbps(
    nbytes: int,
    repeats: int = 5,
    chunk: int = 1 << 20,
    *,
    recv_chunk: int = 128 << 10,
    timeout_s: float | None = None,
) -> dict[str, float]:
    """Measure one raw TCP stream over loopback between two processes.

    The calling process listens on 127.0.0.1 (port 0), spawns a receiver process
    that connects, and sends it ``nbytes`` bytes ``repeats`` times (after one
    uncounted warm-up transfer) from a preallocated buffer with ``sendall`` on
    ``chunk``-byte memoryview slices; the receiver fills a preallocated
    ``nbytes`` buffer with ``recv_into`` (at most ``recv_chunk`` bytes a call), acks each
    full transfer with one byte, so each timing is end to end. No buffer is
    allocated per chunk. ``TCP_NODELAY`` is set; socket buffers are left to the
    kernel's autotuning (measured to be as fast as explicit large buffers).

    Chunk defaults were measured (2-core host, 100 MiB): 1 MiB sends with 64-128 KiB
    receives gave ~3.9 GB/s, 4 MiB with 4 MiB ~2.2 GB/s; small receives return
    socket-buffer space to the sender sooner, so both processes copy concurrently.

    Blocks for about ``(repeats + 1) * nbytes / rate`` plus the receiver's spawn
    (0.1 s bare, ~1.5 s once importing the ``trimtab`` package pulls in torch):
    ~0.2 s of transfers for 100 MiB x 6 at 3-4 GB/s, ~2 s per call in all on a
    2-core host. Memory: ``nbytes`` in each process.

    Args:
        nbytes: bytes per transfer.
        repeats: counted transfers; the median is reported.
        chunk: bytes per sender ``sendall`` call.
        recv_chunk: most bytes per receiver ``recv_into`` call.
        timeout_s: limit for each socket operation; ``None`` picks
            ``30 + nbytes / 50e6`` seconds.

    Returns:
        ``{"bytes_per_s": median rate, "gbps": median rate in gigabits/s,
        "seconds": median transfer time}``.

    Raises:
        ValueError: if ``nbytes``, ``repeats``, ``chunk`` or ``recv_chunk`` is not
            positive.
        RuntimeError: if the receiver fails to start or connect within 60 s,
            a socket operation fails or times out, or the receiver exits non-zero.
            The receiver process is always reaped (terminated if needed).
    """
    return _tcp_ceiling(
        nbytes,
        repeats,
        chunk,
        recv_chunk=recv_chunk,
        sockbuf=_TCP_SOCKBUF,
        timeout_s=timeout_s,
    )


# -------------------------------------------------------------------------- gloo


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
        os.environ["MASTER_ADDR"] = _HOST
        os.environ["MASTER_PORT"] = str(port)
        import torch
        import torch.distributed as dist

        dist.init_process_group(
            backend="gloo",
            init_method=f"tcp://{_HOST}:{port}",
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
                _free_port(),
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
    ctx = _ctx()
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
        limit_s = _STARTUP_S + timeout_s
        times = _collect_gloo(procs, results, time.monotonic() + limit_s, limit_s)
        ok = True
    finally:
        # On failure the surviving ranks may be blocked in a collective: don't wait.
        _reap(procs, 10.0 if ok else 0.5)
    return times


# --------------------------------------------------------------------------- zmq


#: The header frame of ``zmq_rtt_per_s(framed=True)``: about a data message's msgpack
#: header (op, request id, chunk, epoch, clock, dtype, elements...).
_FRAMED_HEADER = b"\x8a" + bytes(range(47))


def _await_message(sock: Any, spin_s: float) -> None:
    """Poll ``sock`` without sleeping for up to ``spin_s`` until a message is there (the
    blocking receive that follows takes it, or sleeps for it after the spin)."""
    if spin_s <= 0:
        return
    until = time.perf_counter() + spin_s
    while not sock.poll(0) and time.perf_counter() < until:
        pass


def _zmq_echo(
    payload_bytes: int,
    round_trips: int,
    timeout_s: float,
    ports: MpQueue[int | str],
    framed: bool = False,
    spin_s: float = 0.0,
) -> None:
    """Spawned echo side: bind 127.0.0.1, report the port, echo ``round_trips``
    messages (REP; ROUTER with ``framed``), polling ``spin_s`` before each receive."""
    try:
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER if framed else zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
        port = sock.bind_to_random_port(f"tcp://{_HOST}")
        ports.put(port)
        for _ in range(round_trips):
            _await_message(sock, spin_s)
            if framed:  # [identity, header, payload], answered with the same shape
                parts = sock.recv_multipart(copy=False)
                if len(parts) != 3 or len(parts[2].buffer) != payload_bytes:
                    raise ValueError(f"got {len(parts)} frames, expected 3 of them")
                sock.send_multipart(parts, copy=False)
                continue
            msg = sock.recv()
            if len(msg) != payload_bytes:
                raise ValueError(f"got {len(msg)} bytes, expected {payload_bytes}")
            sock.send(msg)
        sock.close()
        ctx.term()
    except Exception:
        ports.put(traceback.format_exc())
        raise SystemExit(1) from None


def zmq_rtt_per_s(
    payload_bytes: int = 1024,
    round_trips: int = 5000,
    *,
    warmup: int = 200,
    timeout_s: float = 10.0,
    framed: bool = False,
    spin_s: float = 0.0,
) -> dict[str, float]:
    """Raw pyzmq REQ/REP round trips per second between two processes over loopback.

    A spawned process binds a REP socket on 127.0.0.1 (random port) and echoes every
    message; this process connects a REQ socket and times ``round_trips`` round trips of
    a ``payload_bytes`` message, each out and back (as a push carries a gradient and its
    reply the updated value), after ``warmup`` untimed ones. Plain ``send``/``recv``
    (pyzmq copies small messages anyway). Every reply is checked for size and content.

    With ``framed``, the sockets and framing trimtab's data path uses and nothing else:
    a DEALER sends a 48-byte header frame and the payload frame, a ROUTER echoes both
    (``recv_multipart``/``send_multipart`` with ``copy=False``), the DEALER receives
    them. What no Python design over these sockets can beat here.

    With ``spin_s``, both sides poll their socket without sleeping for up to that long
    before each receive, as trimtab's nodes do with ``TRIMTAB_SPIN_US``: the raw
    exchange with the same trick.

    Blocks for the spawn (~0.2 s) plus the round trips (~0.1 ms each on a 2-core host:
    about a second for the defaults).

    Returns:
        ``{"per_s": round trips per second, "rtt_s": mean round trip seconds,
        "round_trips": round_trips}``.

    Raises:
        ValueError: if ``payload_bytes`` or ``round_trips`` is not positive, or
            ``warmup`` or ``spin_s`` is negative.
        RuntimeError: if the echo process fails to start within 60 s, a reply takes over
            ``timeout_s``, a reply is wrong, or the echo process exits non-zero. It is
            always reaped (terminated if needed).
    """
    if payload_bytes <= 0 or round_trips <= 0 or warmup < 0 or spin_s < 0:
        raise ValueError(
            "payload_bytes and round_trips must be positive, warmup and spin_s "
            f"non-negative: {payload_bytes}, {round_trips}, {warmup}, {spin_s}"
        )
    import zmq

    ctx = _ctx()
    ports: MpQueue[int | str] = ctx.Queue()
    proc = ctx.Process(
        target=_zmq_echo,
        args=(payload_bytes, warmup + round_trips, timeout_s, ports, framed, spin_s),
        name="trimtab-zmq-echo",
        daemon=True,
    )
    payload = bytes(range(256)) * (payload_bytes // 256) + b"\xa5" * (payload_bytes % 256)
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER if framed else zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    proc.start()
    try:
        try:
            port = ports.get(timeout=_STARTUP_S)
        except queue.Empty:
            raise RuntimeError("zmq round trips: the echo process never started") from None
        if isinstance(port, str):
            raise RuntimeError(f"zmq round trips: the echo process failed:\n{port}")
        sock.connect(f"tcp://{_HOST}:{port}")
        start = 0.0
        for i in range(warmup + round_trips):
            if i == warmup:
                start = time.perf_counter()
            if framed:
                sock.send_multipart([_FRAMED_HEADER, payload], copy=False)
                _await_message(sock, spin_s)
                header, body = sock.recv_multipart(copy=False)
                if body.bytes != payload or header.bytes != _FRAMED_HEADER:
                    raise RuntimeError("zmq round trips: the echo came back changed")
                continue
            sock.send(payload)
            _await_message(sock, spin_s)
            if sock.recv() != payload:
                raise RuntimeError("zmq round trips: the echo came back changed")
        seconds = time.perf_counter() - start
    except zmq.Again:
        raise RuntimeError(f"zmq round trips: no reply within {timeout_s:g}s") from None
    finally:
        sock.close()
        zctx.term()
        _reap([proc], 10.0)
    if proc.exitcode != 0:
        raise RuntimeError(f"zmq round trips: the echo process exited with code {proc.exitcode}")
    return {
        "per_s": round_trips / seconds,
        "rtt_s": seconds / round_trips,
        "round_trips": round_trips,
    }
