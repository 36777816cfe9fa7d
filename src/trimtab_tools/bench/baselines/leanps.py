"""The lean PS: ``bench datapath``'s step with nothing but Python, pyzmq and torch.

A baseline for the data path, run beside trimtab by ``trimtab bench datapath --peers
lean`` (with ``--testbed``, each role on the host where trimtab's runs). It does what a
synchronous parameter server's step must do, the way trimtab does it, and nothing else:

* each tensor cut into chunks of ``chunk_bytes``; chunk ``i`` on server ``i % servers``;
* a worker pushes every chunk, the last layers first (as backward makes them), with
  P3's credit: one chunk in flight to each server, a CREDIT returned on receipt, the
  held pushes released first layers first;
* a server merges each push into the chunk's mean as it arrives (in place), and once
  every worker's is in, takes the SGD step and sends the value to every worker, held to
  one chunk in flight per worker the same way (the worker credits each value it reads);
* a worker copies each value into its parameter.

What it leaves out is what trimtab adds: membership and heartbeats, the placement map,
epochs and moved chunks, authentication, versions, priorities across messages queued at
a server, meters for PSLD, replicas and every check on what a peer sends beyond sizes.
So ``step_over_lean`` in ``bench datapath``'s JSON is what those layers cost a step on
the same machine in the same run, and the lean step against the TCP floor is what a
Python and ZeroMQ parameter server can reach there.

Its own wire format: a header frame ``<B I I>`` (op, chunk id, step) and, for a push or
a value, one frame of the chunk's float32 bytes. The job is ours only, on loopback or a
test bed; a server still refuses (ends the job with an error) a frame of the wrong size
or an unknown chunk, and every wait has a timeout.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import struct
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from trimtab.launch.hosts import Layout
from trimtab_tools.bench.markers import RESULT
from trimtab_tools.bench.procs import Job, step_figures

__all__ = ["GRAD", "LR", "chunks_of", "run_lean"]

#: The SGD learning rate and every gradient's value (as the datapath worker's).
LR = 0.1
GRAD = 1e-3
#: A wait for the next message gives up after this long (the job is then over).
WAIT_S = 60.0

_HEADER = struct.Struct("<BII")
_HELLO, _READY, _PUSH, _VALUE, _CREDIT, _BYE = range(1, 7)
_LOCAL = "127.0.0.1"
_PORT = "LEANPS_PORT "


def chunks_of(sizes: Sequence[int], chunk_bytes: int) -> list[tuple[int, int, int]]:
    """The chunks of tensors of ``sizes`` bytes (float32): (tensor, first element,
    elements) each, in order; chunk ids are their places in the list. Never blocks."""
    out: list[tuple[int, int, int]] = []
    per = max(1, chunk_bytes // 4)
    for t, size in enumerate(sizes):
        numel = size // 4
        out.extend((t, at, min(per, numel - at)) for at in range(0, numel, per))
    return out


class _Window:
    """One message in flight per peer; the held ones released lowest chunk id first."""

    def __init__(self) -> None:
        self.busy: dict[Hashable, bool] = {}
        self.held: dict[Hashable, list[int]] = {}

    def admit(self, peer: Hashable, chunk: int) -> bool:
        if self.busy.get(peer):
            heapq.heappush(self.held.setdefault(peer, []), chunk)
            return False
        self.busy[peer] = True
        return True

    def credit(self, peer: Hashable) -> int | None:
        held = self.held.get(peer)
        if held:
            return heapq.heappop(held)
        self.busy[peer] = False
        return None


def _fail(why: str) -> None:
    print(f"leanps: {why}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def _serve(
    host: str,
    index: int,
    servers: int,
    workers: int,
    sizes: list[int],
    cb: int,
    announce: Callable[[int], None] | None = None,
) -> None:
    """Server ``index``: bind on ``host``, say the port (``announce``, else a
    ``LEANPS_PORT`` line), serve until every worker said BYE. Blocks; exits the process
    (SystemExit) on a message it refuses or a silence of :data:`WAIT_S`."""
    import torch
    import zmq

    from trimtab.runtime.tensors import as_bytes  # (torch: only in the role's process)

    torch.set_num_threads(1)
    chunks = chunks_of(sizes, cb)
    mine = [c for c in range(len(chunks)) if c % servers == index]
    value = {c: torch.zeros(chunks[c][2]) for c in mine}
    mean = {c: torch.zeros(chunks[c][2]) for c in mine}
    arrived = dict.fromkeys(mine, 0)
    window = _Window()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port(f"tcp://{host}")
    if announce is not None:
        announce(port)
    else:
        print(f"{_PORT}{port}", flush=True)
    peers: list[bytes] = []
    done = 0

    def send_value(peer: bytes, c: int) -> None:
        frame = as_bytes(value[c])
        sock.send_multipart([peer, _HEADER.pack(_VALUE, c, 0), frame], copy=False)

    while done < workers:
        if not sock.poll(int(WAIT_S * 1000)):
            _fail(f"server {index}: no message in {WAIT_S:.0f} s")
        peer, head, *body = sock.recv_multipart(copy=False)
        who = peer.bytes
        op, c, _ = _HEADER.unpack(head.bytes)
        if op == _PUSH:
            sock.send_multipart([who, _HEADER.pack(_CREDIT, c, 0)])
            if c not in arrived or len(body) != 1 or len(body[0]) != 4 * chunks[c][2]:
                _fail(f"server {index}: a push of chunk {c} it does not hold, or of another size")
            grad = torch.frombuffer(body[0].buffer, dtype=torch.float32)
            if arrived[c] == 0:
                torch.mul(grad, 1.0 / workers, out=mean[c])
            else:
                mean[c].add_(grad, alpha=1.0 / workers)
            arrived[c] += 1
            if arrived[c] == workers:
                arrived[c] = 0
                value[c].add_(mean[c], alpha=-LR)
                for p in peers:
                    if window.admit(p, c):
                        send_value(p, c)
        elif op == _CREDIT:
            nxt = window.credit(who)
            if nxt is not None:
                send_value(who, nxt)
        elif op == _HELLO:
            peers.append(who)
            if len(peers) == workers:
                for p in peers:
                    sock.send_multipart([p, _HEADER.pack(_READY, 0, 0)])
        elif op == _BYE:
            done += 1
    sock.close(linger=1000)
    ctx.term()


def _work(
    addresses: list[str], rank: int, sizes: list[int], cb: int, steps: int, warmup: int
) -> list[float]:
    """Worker ``rank``: ``warmup + steps`` steps against the servers at ``addresses``;
    returns the timed steps' seconds. Blocks; exits the process (SystemExit) if the SGD
    result is wrong or a server falls silent."""
    import torch
    import zmq

    from trimtab.runtime.tensors import as_bytes

    torch.set_num_threads(1)
    chunks = chunks_of(sizes, cb)
    params = [torch.zeros(s // 4) for s in sizes]
    grads = [torch.full((s // 4,), GRAD) for s in sizes]
    ctx = zmq.Context()
    socks = []
    for address in addresses:
        s = ctx.socket(zmq.DEALER)
        s.connect(address)
        s.send(_HEADER.pack(_HELLO, rank, 0))
        socks.append(s)
    for s in socks:
        if not s.poll(int(WAIT_S * 1000)) or _HEADER.unpack(s.recv())[0] != _READY:
            _fail(f"worker {rank}: a server did not say READY")
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    servers = len(socks)
    times = []
    for step in range(warmup + steps):
        started = time.perf_counter()
        window = _Window()

        def send(c: int, step: int = step) -> None:
            t, at, n = chunks[c]
            frame = as_bytes(grads[t][at : at + n])
            socks[c % servers].send_multipart([_HEADER.pack(_PUSH, c, step), frame], copy=False)

        for c in reversed(range(len(chunks))):
            if window.admit(c % servers, c):
                send(c)
        left = len(chunks)
        while left:
            ready = poller.poll(int(WAIT_S * 1000))
            if not ready:
                _fail(f"worker {rank}: no message in {WAIT_S:.0f} s")
            for s, _ in ready:
                k = socks.index(s)
                while s.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    head, *body = s.recv_multipart(copy=False)
                    op, c, _ = _HEADER.unpack(head.bytes)
                    if op == _CREDIT:
                        nxt = window.credit(k)
                        if nxt is not None:
                            send(nxt)
                        continue
                    s.send(_HEADER.pack(_CREDIT, c, step))
                    t, at, n = chunks[c]
                    got = torch.frombuffer(body[0].buffer, dtype=torch.float32)
                    params[t][at : at + n].copy_(got)
                    left -= 1
        if step >= warmup:
            times.append(time.perf_counter() - started)
    want = -(warmup + steps) * LR * GRAD
    tolerance = 1e-6 * (1 + abs(want))  # every element: a chunk never written stays 0
    wrong = [i for i, p in enumerate(params) if float((p - want).abs().max()) > tolerance]
    if wrong:
        _fail(f"worker {rank}: tensors {wrong} do not hold the SGD result {want}")
    for s in socks:
        s.send(_HEADER.pack(_BYE, rank, 0))
        s.close(linger=1000)
    ctx.term()
    return times


def run_lean(
    sizes: Sequence[int],
    steps: int,
    chunk_bytes: int,
    *,
    warmup: int = 3,
    servers: int = 2,
    workers: int = 2,
    layout: Layout | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Time ``steps`` steps of the lean PS after ``warmup``: ``servers`` servers and
    ``workers`` workers as processes of this interpreter on 127.0.0.1, or with a test
    bed's ``layout`` each on the host of trimtab's role of the same kind and rank. Every
    process is ended and reaped before this returns.

    Blocks for the job: interpreter starts plus the steps, at most ``timeout_s``
    (default ``60 + 5 s`` a step).

    Returns:
        ``{"median_s", "p90_s", "steps"}``, worker 0's step times.

    Raises:
        ValueError: ``steps < 1``, ``warmup < 0`` or no sizes.
        RuntimeError: a process failed or timed out, or no result came (with the last
            lines the processes printed).
    """
    if steps < 1 or warmup < 0 or not sizes:
        raise ValueError(f"need steps >= 1, warmup >= 0 and sizes: {steps}, {warmup}, {sizes}")
    if timeout_s is None:
        timeout_s = 60.0 + 5.0 * (warmup + steps)
    where = layout or Layout()
    me = [sys.executable, "-m", __name__]
    common = ["--sizes", ",".join(map(str, sizes)), "--chunk-bytes", str(chunk_bytes)]
    job = Job("lean")
    deadline = time.monotonic() + timeout_s
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        addresses = []
        for i in range(servers):
            on = where.server(i)
            host = where.address(on, _LOCAL)
            argv = [*me, "server", host, str(i), str(servers), str(workers), *common]
            job.spawn(f"server {i}", where.run(on, argv), env)
            addresses.append(f"tcp://{host}:{_port(job, f'server {i}', deadline)}")
        names = [f"worker {r}" for r in range(workers)]
        for rank, name in enumerate(names):
            argv = [*me, "worker", ",".join(addresses), str(rank), *common]
            argv += ["--steps", str(steps), "--warmup", str(warmup)]
            job.spawn(name, where.run(where.worker(rank), argv), env)
        failed = job.wait([n for n, _ in job.procs], deadline)
    finally:
        job.stop()
    return step_figures(job.result(failed, timeout_s, RESULT, steps, "lean PS")["times"])


def _port(job: Job, name: str, deadline: float) -> int:
    """The port server ``name`` printed; raises RuntimeError if it exits or is late."""
    while time.monotonic() < deadline:
        for who, line in list(job.lines):
            if who == name and line.startswith(_PORT):
                return int(line[len(_PORT) :])
        if job.wait([], time.monotonic()) is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"lean PS {name} did not start:\n{job.log()}")


def main(argv: Sequence[str] | None = None) -> int:
    """``server HOST INDEX SERVERS WORKERS`` or ``worker ADDRESSES RANK``, with
    ``--sizes`` and ``--chunk-bytes`` (a worker: ``--steps``, ``--warmup``). The exit
    status."""
    parser = argparse.ArgumentParser(prog="leanps")
    parser.add_argument("role", choices=["server", "worker"])
    parser.add_argument("args", nargs="+")
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--chunk-bytes", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    a = parser.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.role == "server":
        host, index, servers, workers = a.args
        _serve(host, int(index), int(servers), int(workers), sizes, a.chunk_bytes)
    else:
        addresses, rank = a.args
        times = _work(addresses.split(","), int(rank), sizes, a.chunk_bytes, a.steps, a.warmup)
        if int(rank) == 0:
            print(RESULT + json.dumps({"times": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
