"""P3's credit over real sockets: a worker with a bound on push bytes in flight per
server holds later layers' pushes back and sends them first layers first as credit
returns; credit returns on receipt, so two workers that push in opposite orders, each
with room for one chunk, never wait on each other (credit on reply would deadlock them:
each one's first push waits for the other's, held behind it). The servers hold their
values to the same window, and each value the worker reads is credited back."""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import trimtab
import trimtab.roles.server.node
from tests.conftest import processes_of
from trimtab import Context, WorkerConfig
from trimtab.launch.job import Job, LaunchConfig
from trimtab.protocol.messages import Data, decode
from trimtab.roles.server.receipt import Receipts
from trimtab.runtime.credit import window_from_env

CHUNK = 64 * 1024  # bytes: each parameter below is one chunk
NUMEL = CHUNK // 4
NAMES = ("a", "b", "c", "d")  # chunk ids 0..3, in this order


def chain(params: list[torch.Tensor], order: list[int]) -> torch.Tensor:
    """A loss that uses the parameters in ``order``: backward produces their gradients
    in the reverse order, and the optimizer's hooks push them as they come."""
    x = torch.ones(NUMEL)
    for i in order:
        x = x * params[i]
    return x.sum()


def credited(cluster: Any) -> Context:
    """The context of the cluster's worker 0, through TCP only, with room for one chunk
    in flight each way."""
    return Context(
        WorkerConfig(
            coordinator=cluster.coordinator.address,
            job=cluster.job,
            rank=0,
            request_timeout_s=30.0,
            shared_memory=False,
            credit_bytes=CHUNK,
        )
    )


@pytest.mark.timeout(120)
def test_held_pushes_reach_the_server_first_layers_first(
    cluster_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker, one server, room for one chunk: backward pushes d, c, b, a; d goes,
    the rest are held (the server holds d's credit back for a second, so all three are
    held by the time it returns, however busy the machine), then a, b, c go in that
    order."""
    received: list[int] = []
    stalled = threading.Event()

    acknowledge = Receipts.acknowledge

    def slow_receipts(self: Receipts, burst: list[Any], coordinator: bytes) -> list[Any]:
        pushes = [
            peer != coordinator and decode(frames[0], self._loop.job).get("o") == Data.PUSH
            for peer, frames in burst
        ]
        if any(pushes) and not stalled.is_set():  # the first push: its credit waits
            stalled.set()
            time.sleep(1.0)
        out = acknowledge(self, burst, coordinator)
        received.extend(h["c"] for _, _, h in out if h is not None and h.get("o") == Data.PUSH)
        return out

    monkeypatch.setattr(Receipts, "acknowledge", slow_receipts)
    cluster = cluster_factory(workers=1, servers=1, transport="tcp", chunk_bytes=CHUNK)
    ctx = credited(cluster)
    try:
        params = [torch.nn.Parameter(torch.ones(NUMEL)) for _ in NAMES]
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(params, lr=0.5),
            list(zip(NAMES, params, strict=True)),
            context=ctx,
        )
        for _ in range(2):
            opt.zero_grad()
            chain(params, [0, 1, 2, 3]).backward()
            opt.step()
        gate = ctx.client.credit
        assert gate is not None
        assert gate.stats.peak_bytes == CHUNK  # never more than the window in flight
        assert gate.stats.held >= 3
        # Step 1: d first (nothing was in flight), then the held ones, first layers first.
        assert received[:4] == [3, 0, 1, 2], received
        assert sorted(received[4:]) == [0, 1, 2, 3]
        # The server held its values to the same window: room for one, each credited
        # back as the worker read it (else the second step would never have ended).
        values = cluster.servers[0]._receipts.values.stats
        assert values.admitted + values.held == 8, values
        assert values.peak_bytes == CHUNK, values
        # Every chunk was updated once per step, as one process's SGD does it.
        local = [torch.nn.Parameter(torch.ones(NUMEL)) for _ in NAMES]
        sgd = torch.optim.SGD(local, lr=0.5)
        for _ in range(2):
            sgd.zero_grad()
            chain(local, [0, 1, 2, 3]).backward()
            sgd.step()
        for got, want in zip(params, local, strict=True):
            assert torch.allclose(got.detach(), want.detach())
    finally:
        ctx.close()


@pytest.mark.timeout(120)
def test_a_steps_values_are_read_by_the_thread_that_waits_for_them(
    cluster_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the training thread waits for a step's values, the credit thread leaves the
    data sockets to it: each value is read by the thread that writes it, not read by
    the credit thread and handed over (a wake-up and a thread switch per chunk). The
    server sends no value of a step until the training thread has begun to wait, so
    every value arrives while it waits, however busy the machine."""
    from trimtab.roles.worker.client import WorkerClient

    waiting = threading.Event()
    readers: list[str] = []
    reply, receiving, on_message = Receipts.reply, WorkerClient.receiving, WorkerClient._on_message
    current = Receipts.current  # (the steady-state push's reply: roles/server/steady.py)

    def reply_once_waited(self: Receipts, r: Any) -> None:
        assert waiting.wait(30.0)
        reply(self, r)

    def current_once_waited(self: Receipts, r: Any) -> None:
        assert waiting.wait(30.0)
        current(self, r)

    @contextlib.contextmanager
    def marked(self: WorkerClient) -> Iterator[None]:
        with receiving(self):
            waiting.set()
            yield
            waiting.clear()  # (the next step's values wait for its own wait)

    def recorded(self: WorkerClient, peer: bytes, frames: list[memoryview]) -> None:
        if peer != self._coord and decode(frames[0], self.config.job)["o"] == Data.VALUE:
            readers.append(threading.current_thread().name)
        on_message(self, peer, frames)

    cluster = cluster_factory(workers=1, servers=1, transport="tcp", chunk_bytes=CHUNK)
    ctx = credited(cluster)
    try:
        params = [torch.nn.Parameter(torch.ones(NUMEL)) for _ in NAMES]
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(params, lr=0.5), list(zip(NAMES, params, strict=True)), context=ctx
        )
        monkeypatch.setattr(Receipts, "reply", reply_once_waited)
        monkeypatch.setattr(Receipts, "current", current_once_waited)
        monkeypatch.setattr(WorkerClient, "receiving", marked)
        monkeypatch.setattr(WorkerClient, "_on_message", recorded)
        steps = 3
        for _ in range(steps):
            opt.zero_grad()
            chain(params, [0, 1, 2, 3]).backward()
            opt.step()
        assert ctx.client.credit is not None and ctx.client.credit.stats.held >= 1
        # The credit thread may finish the one message it was reading as the training
        # thread began to wait; every other value is the training thread's own.
        me = threading.current_thread().name
        assert len(readers) == steps * len(NAMES), readers
        assert readers.count(me) >= steps * (len(NAMES) - 1), readers
    finally:
        ctx.close()


@pytest.mark.timeout(60)
def test_the_default_window_is_one_chunk_of_the_job(cluster_factory) -> None:
    """Unset, TRIMTAB_CREDIT_BYTES leaves one chunk in flight each way: the window is the
    job's chunk size, which the worker learns when it registers."""
    cluster = cluster_factory(workers=1, servers=1, transport="tcp", chunk_bytes=CHUNK)
    config = WorkerConfig(
        coordinator=cluster.coordinator.address,
        job=cluster.job,
        rank=0,
        shared_memory=False,
        credit_bytes=window_from_env({}),
    )
    ctx = Context(config)
    try:
        assert ctx.client.credit is not None and ctx.client.credit.window == CHUNK
    finally:
        ctx.close()


WORKER = textwrap.dedent(
    """
    import json, sys, torch, trimtab
    import trimtab.frontend.api
    sys.path.insert(0, sys.argv[1])
    from tests.integration.test_credit import NAMES, NUMEL, chain
    trimtab.init()
    params = [torch.nn.Parameter(torch.ones(NUMEL)) for _ in NAMES]
    opt = trimtab.DistributedOptimizer(
        torch.optim.SGD(params, lr=0.25), list(zip(NAMES, params)))
    # Opposite orders: rank 0's backward pushes d, c, b, a; rank 1's a, b, c, d.
    order = [0, 1, 2, 3] if trimtab.rank() == 0 else [3, 2, 1, 0]
    local = [torch.nn.Parameter(torch.ones(NUMEL)) for _ in NAMES]
    sgd = torch.optim.SGD(local, lr=0.25)
    for _ in range(5):
        opt.zero_grad()
        chain(params, order).backward()
        opt.step()
        sgd.zero_grad()  # one process's SGD, for the values to compare
        chain(local, order).backward()
        sgd.step()
    diff = max((p - q).abs().max().item() for p, q in zip(params, local))
    gate = trimtab.frontend.api.default_context().client.credit
    print("RESULT " + json.dumps({
        "diff": diff, "peak": gate.stats.peak_bytes, "held": gate.stats.held,
    }), flush=True)
    trimtab.shutdown()
    """
)


@pytest.mark.timeout(120)
def test_workers_pushing_in_opposite_orders_do_not_stall_each_other(tmp_path: Path) -> None:
    """Real processes over TCP (no shared memory, no lane): 2 workers, 1 server, room
    for one chunk each. Under BSP each chunk's reply waits for both workers' pushes;
    with each worker's first push the chunk the other holds back for last, only credit
    returned on receipt lets the job go on."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    lines: list[str] = []
    config = LaunchConfig(workers=2, servers=1, chunk_bytes=CHUNK)
    repo = str(Path(__file__).resolve().parents[2])
    job = Job(
        config,
        [sys.executable, str(script), repo],
        output=lambda src, line: lines.append(line),
        extra_env={"TRIMTAB_SHM": "0", "TRIMTAB_CREDIT_BYTES": str(CHUNK)},
    )
    assert job.run() == 0, lines[-30:]
    results = [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]
    assert len(results) == 2, lines[-30:]
    for r in results:
        assert r["diff"] < 1e-6, r  # both pushed the same gradients: one process's SGD
        assert r["peak"] == CHUNK, r
        assert r["held"] > 0, r  # the bound did hold pushes back
    assert processes_of(config.job) == []
