"""The ceiling of trimtab's small messages: raw pyzmq round trips between two
processes, alone or in trimtab's own socket pattern and framing."""

from __future__ import annotations

import queue
import time
import traceback
from multiprocessing.queues import Queue as MpQueue
from typing import Any

from trimtab_tools.bench.baselines.common import HOST, STARTUP_S, reap, spawn_context

__all__ = ["zmq_rtt_per_s"]

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
        port = sock.bind_to_random_port(f"tcp://{HOST}")
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

    ctx = spawn_context()
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
            port = ports.get(timeout=STARTUP_S)
        except queue.Empty:
            raise RuntimeError("zmq round trips: the echo process never started") from None
        if isinstance(port, str):
            raise RuntimeError(f"zmq round trips: the echo process failed:\n{port}")
        sock.connect(f"tcp://{HOST}:{port}")
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
        reap([proc], 10.0)
    if proc.exitcode != 0:
        raise RuntimeError(f"zmq round trips: the echo process exited with code {proc.exitcode}")
    return {
        "per_s": round_trips / seconds,
        "rtt_s": seconds / round_trips,
        "round_trips": round_trips,
    }
