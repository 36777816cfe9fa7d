"""The raw TCP rate between two hosts of a test bed, with Python sockets.

A receiver runs in one host (``python -m trimtab.launch.tcprate recv ADDRESS``: it
prints its port, takes one connection, reads to the end and prints ``BYTES SECONDS``,
timed from the first byte to the last), a sender in the other (``send ADDRESS PORT
SECONDS``: it writes 1 MiB buffers for that long, then closes). :func:`measure` runs both
with ``ip netns exec`` and returns bytes per second: the bed's TCP floor, what no
protocol above one stream can beat.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["RateError", "main", "measure"]

_BUFFER = 1 << 20


class RateError(RuntimeError):
    """The sender or the receiver of a measure failed."""


def measure(
    sender: Sequence[str], receiver: Sequence[str], address: str, seconds: float = 1.0
) -> float:
    """Bytes per second of one TCP stream to ``address`` over ``seconds``, the sender run
    behind the command prefix ``sender`` (``ip netns exec NS``), the receiver behind
    ``receiver``, bound to ``address``. Blocks about ``seconds`` plus two interpreter
    starts. Raises :class:`RateError` if either side fails."""
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
        nbytes, elapsed = out.split()
        return int(nbytes) / max(float(elapsed), 1e-9)
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
        first = time.perf_counter()
        while n := conn.recv_into(buf):
            total += n
        elapsed = time.perf_counter() - first
    print(total, elapsed, flush=True)


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
