"""A slow server emulated around it, as ``trimtab server`` wires it: every server of an
in-process job behind a :class:`ThrottledTransport` with the same specs, of which one
names server 0. Server 0 is paced per byte and busy for it; server 1 is not."""

from __future__ import annotations

import uuid

import torch

import trimtab
from trimtab import Context, Coordinator, CoordinatorConfig, Server, ServerConfig, WorkerConfig
from trimtab.faults.stragglers import parse_stragglers
from trimtab.faults.throttle import ThrottledTransport
from trimtab.transport import Fabric

DELAY_S_PER_BYTE = 5e-6  # server:0:delay=5s/MB


def test_only_the_named_server_is_paced_and_its_pauses_are_busy_time() -> None:
    fabric, job = Fabric(), uuid.uuid4().hex[:8]
    coordinator = Coordinator(
        CoordinatorConfig(num_workers=1, num_servers=2, job=job, chunk_bytes=4096),
        fabric.transport(bind=True),
    )
    threads = [coordinator.start()]
    specs = parse_stragglers("server:0:delay=5s/MB")
    servers = []
    for _ in range(2):
        throttle = ThrottledTransport(fabric.transport(bind=True), specs, job, coordinator.address)
        server = Server(ServerConfig(coordinator=coordinator.address, job=job), throttle)
        throttle.follow(server)
        servers.append(server)
        threads.append(server.start())
    ctx = Context(
        WorkerConfig(coordinator=coordinator.address, job=job, rank=0, request_timeout_s=60),
        transport=fabric.transport(bind=False),
    )
    try:
        model = torch.nn.Linear(32, 64)  # 8 KiB of weights: two chunks, one per server
        opt = trimtab.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context=ctx
        )
        for _ in range(3):
            model(torch.ones(2, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
        stats = {s["index"]: s for s in ctx.server_stats()}
    finally:
        ctx.close()
        coordinator.abort("test over")
        for s in servers:
            s.stop()
        for t in threads:
            t.join(10)
    slow, fast = stats[0], stats[1]
    assert slow["bytes"] > 10_000 and fast["bytes"] > 10_000
    # Every byte server 0 counted was paced, inside its busy time; server 1's busy
    # time is its own work only (well under what the same pacing would have cost).
    assert slow["busy_s"] >= 0.95 * slow["bytes"] * DELAY_S_PER_BYTE
    assert fast["busy_s"] < 0.5 * fast["bytes"] * DELAY_S_PER_BYTE
