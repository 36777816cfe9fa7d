"""What the baselines share: spawned helper processes on loopback that never hang."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Sequence
from multiprocessing.context import SpawnProcess

#: Every baseline binds and connects here only.
HOST = "127.0.0.1"

#: How long a spawned helper may take to start (interpreter + imports) on a busy
#: machine before it is declared failed.
STARTUP_S = 60.0


def spawn_context() -> mp.context.SpawnContext:
    """The "spawn" context: helpers start from a fresh interpreter, never a fork."""
    return mp.get_context("spawn")


def free_port() -> int:
    """Return a port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def reap(procs: Sequence[SpawnProcess], timeout_s: float) -> None:
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
