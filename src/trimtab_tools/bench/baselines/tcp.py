"""The ceilings of a byte-moving path on this host: one raw TCP stream over loopback
between two processes, and one core's memcpy."""

from __future__ import annotations

import contextlib
import queue
import socket
import statistics
import time
import traceback
from multiprocessing.queues import Queue as MpQueue

from trimtab_tools.bench.baselines.common import HOST, STARTUP_S, reap, spawn_context

__all__ = ["memcpy_gbps", "tcp_ceiling_gbps"]

# Explicit SO_SNDBUF/SO_RCVBUF for the TCP ceiling; ``None`` keeps the kernel's
# autotuned buffers. Measured on a 2-core dev box (100 MiB, 10 interleaved runs of
# 7 transfers, 1 MiB send / 128 KiB receive chunks): autotune 3.85 GB/s median,
# 4 MiB 3.71, 8 MiB 3.75 -- no difference beyond noise (+-0.5 GB/s). Setting a
# size also turns autotuning off and is capped at net.core.{w,r}mem_max, which can
# be small on other hosts, so the kernel is left alone.
_TCP_SOCKBUF: int | None = None


def _tune(sock: socket.socket, sockbuf: int | None) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sockbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)


def _filled(nbytes: int) -> bytearray:
    # Every page written with non-zero bytes, so neither side reads the shared
    # zero page (which would sit in cache and flatter the figure).
    return bytearray(b"\xa5") * nbytes


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
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
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
    ctx = spawn_context()
    errors: MpQueue[str] = ctx.Queue()
    send_buf = _filled(nbytes)
    view = memoryview(send_buf)
    ack = bytearray(1)
    times: list[float] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as lsock:
        lsock.bind((HOST, 0))
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
            deadline = time.monotonic() + STARTUP_S
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
            reap([proc], 10.0)
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
