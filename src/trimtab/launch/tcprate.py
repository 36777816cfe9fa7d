"""The raw TCP rate between two hosts of a test bed, with Python sockets.

A receiver runs in one host (``python -m trimtab.launch.tcprate recv ADDRESS``: it
prints its port, takes one connection, reads to the end and prints ``BYTES SECONDS
CORES``, timed from the first byte to the last, ``CORES`` the machine's cores busy
meanwhile or ``-``), a sender in the other (``send ADDRESS PORT SECONDS``: it writes 1
MiB buffers for that long, then closes). :func:`measure_stream` runs both with ``ip
netns exec``: bytes per second, the bed's TCP floor, what no protocol above one stream
can beat; and the cores that one stream kept busy, which on a machine whose hosts share
its cores is what is left for anything else (:func:`measure`: the rate alone).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

from trimtab.launch.cores import cores_busy, machine_cpu

__all__ = ["RateError", "Stream", "main", "measure", "measure_stream"]

_BUFFER = 1 << 20


class RateError(RuntimeError):
    """The sender or the receiver of a measure failed."""


class Stream(NamedTuple):
    """One measured stream."""

    #: Bytes per second, from the first byte received to the last.
    bytes_per_s: float
    #: The machine's cores busy meanwhile (``None`` where ``/proc/stat`` is unreadable).
    cores_busy: float | None


def measure(
    sender: Sequence[str], receiver: Sequence[str], address: str, seconds: float = 1.0
) -> float:
    """Bytes per second of one TCP stream (:func:`measure_stream`). Blocks as it does;
    raises :class:`RateError` if either side fails."""
    return measure_stream(sender, receiver, address, seconds).bytes_per_s


def measure_stream(
    sender: Sequence[str], receiver: Sequence[str], address: str, seconds: float = 1.0
) -> Stream:
    """One TCP stream to ``address`` for ``seconds``: its rate and the cores busy while
    it ran. The sender runs behind the command prefix ``sender`` (``ip netns exec NS``),
    the receiver behind ``receiver``, bound to ``address``. Blocks about ``seconds``
    plus two interpreter starts. Raises :class:`RateError` if either side fails."""
    me = [sys.executable, "-m", "trimtab.launch.tcprate"]
    recv = subprocess.Popen(
        [*receiver, *me, "recv", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout is not None
        port = recv.stdout.readline().strip()
        if not port.isdigit():
            raise RateError(f"the receiver did not start: {recv.communicate()[1].strip()}")
        send = subprocess.run(
            [*sender, *me, "send", address, port, str(seconds)],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
        if send.returncode != 0:
            raise RateError(f"the sender failed: {send.stderr.strip()}")
        out, err = recv.communicate(timeout=30)
        if recv.returncode != 0:
            raise RateError(f"the receiver failed: {err.strip()}")
        nbytes, elapsed, cores = out.split()
        rate = int(nbytes) / max(float(elapsed), 1e-9)
        return Stream(rate, None if cores == "-" else float(cores))
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def _recv(address: str) -> None:
    with socket.create_server((address, 0)) as server:
        print(server.getsockname()[1], flush=True)
        server.settimeout(60)
        conn, _ = server.accept()
    with conn:
        buf = bytearray(_BUFFER)
        total = conn.recv_into(buf)
        cpu = machine_cpu()
        first = time.perf_counter()
        while n := conn.recv_into(buf):
            total += n
        elapsed = time.perf_counter() - first
        busy = cores_busy(cpu, machine_cpu(), elapsed)
    print(total, elapsed, "-" if busy is None else f"{busy:.3f}", flush=True)


def _send(address: str, port: int, seconds: float) -> None:
    data = b"\0" * _BUFFER
    with socket.create_connection((address, port), timeout=60) as conn:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.sendall(data)


def main(argv: Sequence[str]) -> int:
    """``recv ADDRESS`` or ``send ADDRESS PORT SECONDS``; the exit status."""
    if len(argv) == 2 and argv[0] == "recv":
        _recv(argv[1])
        return 0
    if len(argv) == 4 and argv[0] == "send":
        _send(argv[1], int(argv[2]), float(argv[3]))
        return 0
    print("usage: tcprate recv ADDRESS | send ADDRESS PORT SECONDS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
