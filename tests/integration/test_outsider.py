"""Issue 19: only the job's own processes may touch the job. A live ``trimtab run`` job
of real processes is attacked by a process on the same machine that knows its addresses
and its id (as ``ps`` shows them) but not its secret; every attack is refused, the job
ends with status 0 and the parameters of one process running the same steps, and no attacked node's
memory grows by what the attacker claimed."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests import attack
from trimtab.launch.control import ask_coordinator
from trimtab.launch.job import Job, LaunchConfig
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, Data, encode
from trimtab.transport.auth import JobKey, read_secret_file

SCRIPT = textwrap.dedent("""
    import json, os, sys, time, torch, trimtab
    trimtab.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       model.named_parameters())
    g = torch.Generator().manual_seed(1 + trimtab.rank())
    go = sys.argv[1]
    for step in range(6):
        if step == 2:
            print("READY", flush=True)
            while go != "-" and not os.path.exists(go):
                time.sleep(0.05)
        opt.zero_grad()
        model(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("PARAMS", json.dumps(flat.tolist()), flush=True)
""")


def run(tmp_path: Path, go: str, during: object = None) -> tuple[int, list[str]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    lines: list[str] = []
    job = Job(
        LaunchConfig(workers=2, servers=1, chunk_bytes=4096),
        [sys.executable, str(script), go],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
    )
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(job.run()))
    thread.start()
    if callable(during):
        deadline = time.monotonic() + 60
        while sum("READY" in line for line in lines) < 2:
            assert time.monotonic() < deadline and thread.is_alive(), lines
            time.sleep(0.05)
        during(job)
    thread.join(120)
    return status[0], lines


def params(lines: list[str]) -> list[torch.Tensor]:
    """Each worker's parameters at the end, as it printed them."""
    return [torch.tensor(json.loads(x.split("PARAMS ")[1])) for x in lines if "PARAMS " in x]


def one_process() -> torch.Tensor:
    """The parameters of one process taking SCRIPT's 6 steps over both workers' batches
    (the mean of their losses): what the job gives when nobody touches it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gens = [torch.Generator().manual_seed(1 + rank) for rank in range(2)]
    for _ in range(6):
        opt.zero_grad()
        losses = [model(torch.randn(8, 16, generator=g)).pow(2).mean() for g in gens]
        (sum(losses) / 2).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.timeout(240)
def test_an_outsider_cannot_touch_a_job(tmp_path: Path) -> None:
    go = tmp_path / "go"
    seen: dict[str, object] = {}

    def attack_job(job: Job) -> None:
        try:
            procs = {p.source: p.handle for p in job._procs}
            coordinator = job.coordinator_address
            # The harness (not the attacker) looks up the server's address.
            assert job._secret_dir is not None
            key = JobKey(read_secret_file(job._secret_dir / "secret"))
            status = headers.read_status_reply(
                ask_coordinator(coordinator, job.config.job, headers.status_request(), 10, key)
            )
            server = status["servers"][0]
            targets = {"coordinator": procs["coordinator"].pid, "server": procs["server 0"].pid}
            job_id = attack.job_id_of(targets["server"])  # as `ps` shows it
            assert job_id == job.config.job
            before = {name: attack.rss_bytes(pid) for name, pid in targets.items()}
            # (a) the lane's framing claims, before any handshake
            for address in (coordinator, server):
                claims = (attack.CLAIM_2_50, attack.CLAIM_1024_X_64M, attack.CLAIM_512M)
                for i, claim in enumerate(claims):
                    seen[f"lane closed {address} {i}"] = attack.lane_send(address, claim)
            # Each request below waits 2 s for a reply that must not come: all at once.
            asks: dict[str, tuple[str, list[bytes]]] = {}
            # (b) 100 MB over TCP to the coordinator: through ZeroMQ, and raw
            asks["tcp 100MB"] = (coordinator, [b"\0" * (100 << 20)])
            attack.raw_tcp(coordinator, b"\xff" + b"\0" * 8 + b"\x7f" + b"\0" * (1 << 20))
            # (c) well-formed data messages with the job id, to the server
            for op in (Data.INIT, Data.PUSH, Data.PULL, Data.STATS):
                h = {"j": job_id, "o": int(op), "i": 1, "c": 0, "e": 1, "dt": "float32", "n": 1}
                h.update(r=0, k=2, w=1.0, v=0)
                asks[f"data {op.name}"] = (server, [encode(h), b"\0" * 4])
            # (d), (e) control messages to the coordinator
            for h in (
                {**headers.scale(servers=3)},
                {**headers.register_worker(rank=0)},
                {**headers.status_request()},
            ):
                msg = {**h, "i": 1, "j": job_id}
                asks[f"control {Control(h['o']).name}"] = (coordinator, [encode(msg)])
            with ThreadPoolExecutor(len(asks)) as pool:
                answered = {k: pool.submit(attack.outsider_request, *a) for k, a in asks.items()}
                seen.update({k: f.result() for k, f in answered.items()})
            after = {name: attack.rss_bytes(pid) for name, pid in targets.items()}
            seen["growth"] = {n: after[n] - before[n] for n in targets}
            seen["alive"] = all(procs[s].poll() is None for s in ("coordinator", "server 0"))
        finally:
            go.touch()

    status, attacked = run(tmp_path, str(go), attack_job)
    assert status == 0, attacked
    assert seen["alive"] is True
    lane = {k: v for k, v in seen.items() if k.startswith("lane closed")}
    assert len(lane) == 6 and all(lane.values()), lane  # each connection closed
    replies = {k: v for k, v in seen.items() if k.startswith(("tcp", "data", "control"))}
    assert replies and not any(replies.values()), replies  # no answer to an outsider
    growth = seen["growth"]
    assert isinstance(growth, dict)
    assert all(g < 50 << 20 for g in growth.values()), growth  # not the claimed sizes
    got = params(attacked)
    assert len(got) == 2, attacked
    expected = one_process()
    assert all(torch.allclose(g, expected, atol=1e-5) for g in got), (got, expected)
