"""Invariant 3 over real sockets: malformed, oversized, out-of-protocol or foreign
messages get a clear error reply, and the server (a real process) goes on serving the
workers with its state intact."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import trimtab
from tests.attack import Member
from trimtab import Context, WorkerConfig
from trimtab.protocol.messages import MAX_HEADER_BYTES, Control, Data, encode
from trimtab.transport.auth import make_secret_file
from trimtab.transport.shm import Arena, job_prefix
from trimtab.transport.zmq import ZmqTransport

STEPS = 6


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A coordinator and one server as real processes; yields (job id, coordinator)."""
    global MEMBER
    job_id = uuid.uuid4().hex[:8]
    address_file = tmp_path / "coord"
    secret = make_secret_file(tmp_path)
    MEMBER = Member(secret)
    base = [sys.executable, "-m", "trimtab"]
    procs = [
        subprocess.Popen(
            [
                *base,
                "coordinator",
                "--workers",
                "2",
                "--servers",
                "1",
                "--job",
                job_id,
                "--chunk-bytes",
                "128",
                "--address-file",
                str(address_file),
                "--secret-file",
                str(secret),
            ]
        )
    ]
    deadline = time.monotonic() + 30
    while not address_file.exists():
        assert time.monotonic() < deadline, "coordinator did not start"
        time.sleep(0.05)
    address = address_file.read_text()
    server = [*base, "server", "--coordinator", address, "--job", job_id]
    procs.append(subprocess.Popen([*server, "--secret-file", str(secret)]))
    yield job_id, address
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail("a role did not exit after the job ended")
    assert procs[1].returncode == 0, "the server must survive bad input and exit cleanly"


MEMBER: Member


def raw_request(address: str, frames: list[bytes]) -> dict:
    """Send frames from a fresh connection that holds the job's secret, as a confused
    (or compromised) member would: authenticated, but malformed."""
    return MEMBER.request(address, frames)


def model_and_data() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    model = torch.nn.Linear(16, 4)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model, [torch.randn(8, 16, generator=g) for _ in range(STEPS)]


def reference() -> list[torch.Tensor]:
    model, xs = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x in xs:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.timeout(120)
def test_bad_messages_are_refused_and_the_server_goes_on(job: tuple[str, str]) -> None:
    job_id, coordinator = job
    results: dict[int, list[torch.Tensor]] = {}
    replies: dict[str, dict] = {}
    errors: list[BaseException] = []

    def attack(ctx: Context) -> None:
        assert ctx.placement is not None
        server = ctx.placement.servers[0]
        c = ctx.chunks[0]

        def push(**over: object) -> dict:
            h = {
                "j": job_id,
                "o": int(Data.PUSH),
                "i": 9,
                "c": c.id,
                "e": 1,
                "r": 0,
                "k": 1,
                "w": 4.0,
                "dt": "float32",
                "n": c.numel,
                "t": ctx.client.credential,  # worker 0's own: its role may push
                **over,
            }
            frame = over.pop("frame", b"\0" * c.nbytes)  # type: ignore[arg-type]
            h.pop("frame", None)
            frames = [encode(h)] + ([] if frame is None else [frame])
            return raw_request(server, frames)  # type: ignore[arg-type]

        # Wait until worker 1 has pushed all its chunks for step 1, so the counters are
        # still while we attack.
        settled = 3 * len(ctx.chunks)
        deadline = time.monotonic() + 20
        while (before := ctx.server_stats()[0])["pushes"] != settled:
            assert time.monotonic() < deadline, f"pushes stuck at {before['pushes']}"
            time.sleep(0.02)
        replies["truncated"] = push(frame=b"\0" * (c.nbytes - 3))
        replies["dtype"] = push(dt="float64")
        replies["bad dtype name"] = push(dt="int8")
        replies["shape"] = push(n=c.numel + 1)
        replies["unknown chunk"] = push(c=10_000)
        replies["future clock"] = push(k=50)
        replies["unknown worker"] = push(r=7)
        replies["wrong job"] = push(j="someone-else")
        replies["inline payload not bytes"] = push(b="not bytes")
        replies["inline payload and a frame"] = push(b=b"\0" * c.nbytes)
        # A push naming a slot of shared memory instead of carrying its gradient.
        arena = Arena.create(job_id, "w0", 1024)  # named as worker 0's arena is
        try:
            replies["shm: not a list"] = push(sm="x", frame=None)
            replies["shm: another job's arena"] = push(sm=["trimtab-other-x", 0, 1024], frame=None)
            gone = job_prefix(job_id) + "w0-gone"
            replies["shm: no such arena"] = push(sm=[gone, 0, 1024], frame=None)
            replies["shm: slot outside the arena"] = push(sm=[arena.name, 512, 1024], frame=None)
            replies["shm: gradient over its slot"] = push(sm=[arena.name, 0, 8], frame=None)
            replies["shm: and a frame"] = push(sm=[arena.name, 0, 1024])
        finally:
            arena.close()
        replies["oversized header"] = raw_request(
            server, [encode({"j": job_id, "o": int(Data.PUSH), "pad": "x" * MAX_HEADER_BYTES})]
        )
        replies["garbage"] = raw_request(server, [b"\xc1\xc1 not msgpack"])
        replies["unknown op"] = raw_request(server, [encode({"j": job_id, "o": 999})])
        replies["no tensor"] = raw_request(
            server,
            [
                encode(
                    {
                        "j": job_id,
                        "o": int(Data.PUSH),
                        "c": c.id,
                        "e": 1,
                        "r": 0,
                        "k": 1,
                        "w": 1.0,
                        "dt": "float32",
                        "n": c.numel,
                        "t": ctx.client.credential,
                    }
                )
            ],
        )
        replies["coordinator garbage"] = raw_request(coordinator, [b"\x92\x01"])
        replies["coordinator unregistered"] = raw_request(
            coordinator, [encode({"j": job_id, "o": int(Control.BARRIER), "name": "x"})]
        )
        after = ctx.server_stats()[0]
        assert after["versions"] == before["versions"], "bad input changed chunk versions"
        assert after["pushes"] == before["pushes"]
        assert after["errors"] == before["errors"] + 20

    def worker(rank: int) -> None:
        try:
            ctx = Context(
                WorkerConfig(coordinator=coordinator, job=job_id, rank=rank, request_timeout_s=30),
                transport=ZmqTransport(bind=False, auth=MEMBER.key),
            )
            model, xs = model_and_data()
            opt = trimtab.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                model.named_parameters(),
                context=ctx,
            )
            for step, x in enumerate(xs):
                if step == 1 and rank == 0:
                    attack(ctx)  # worker 1 is meanwhile waiting on the servers
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
            results[rank] = [p.detach().clone() for p in model.parameters()]
            ctx.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    if errors:
        raise errors[0]
    expected_codes = {
        "truncated": "bad_shape",
        "dtype": "bad_dtype",
        "bad dtype name": "bad_dtype",
        "shape": "bad_shape",
        "unknown chunk": "unknown_chunk",
        "future clock": "bad_state",
        "unknown worker": "forbidden",
        "wrong job": "wrong_job",
        "inline payload not bytes": "malformed",
        "inline payload and a frame": "malformed",
        "shm: not a list": "malformed",
        "shm: another job's arena": "forbidden",
        "shm: no such arena": "no_shm",
        "shm: slot outside the arena": "malformed",
        "shm: gradient over its slot": "malformed",
        "shm: and a frame": "malformed",
        "oversized header": "too_large",
        "garbage": "malformed",
        "unknown op": "unknown_op",
        "no tensor": "malformed",
        "coordinator garbage": "malformed",
        "coordinator unregistered": "bad_state",
    }
    for name, code in expected_codes.items():
        reply = replies[name]
        assert reply["o"] in (int(Data.ERROR), int(Control.ERROR)), name
        assert reply["code"] == code, (name, reply)
        assert len(reply["msg"]) > 10, name  # a sentence, not just a code
    expected = reference()
    for rank in range(2):
        for got, want in zip(results[rank], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
