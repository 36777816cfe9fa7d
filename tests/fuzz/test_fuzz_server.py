"""The server's dispatch, fuzzed in process (in-process transport, no threads): any
message from a peer without a credential is refused or dropped and changes nothing; any
message from an insider (a worker's or a server's credential, the rest arbitrary)
leaves the server serving, and if refused changes nothing. Nothing escapes the
dispatch, and no refusal is INTERNAL (that would be a bug the fuzzing found)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.strategies import frames, headers_of, values
from trimtab.core.chunks import TensorSpec, make_chunks
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, Data, encode
from trimtab.roles.server import Server, ServerConfig
from trimtab.runtime.credentials import SERVER, WORKER, credential, new_key
from trimtab.runtime.tensors import as_bytes
from trimtab.transport import Fabric
from trimtab.transport.shm import job_prefix

JOB = "fuzz"
KEY = new_key()
#: One tensor of 300 float32 cut into two chunks, and a small one: chunks 0, 1 and 2;
#: this server (index 0) owns 0 and 2, server 1 owns 1.
TENSORS = [["w", [300], "float32", 0], ["b", [4], "float32", 0]]
CHUNK_BYTES = 1024
NUMELS = [c.numel for c in make_chunks([TensorSpec.from_wire(t) for t in TENSORS], CHUNK_BYTES)]
DATA_OPS = [int(op) for op in Data]

pytestmark = pytest.mark.timeout(120)


def a_server() -> tuple[Server, Fabric, Any]:
    """A server registered as index 0, placed, seeded by worker 0, with chunk 0's round
    half done (worker 1 pushed) and chunk 1 on its way here from server 1 (epoch 2)."""
    fabric = Fabric()
    coordinator = fabric.transport()
    server = Server(ServerConfig(coordinator=coordinator.address, job=JOB), fabric.transport())
    server._control(
        headers.registered(
            rid=1,
            rank=0,
            num_workers=2,
            num_servers=2,
            chunk_bytes=CHUNK_BYTES,
            heartbeat_s=1.0,
            token=credential(KEY, JOB, SERVER, 0),
            key=KEY,
        )
    )
    job_map: dict[str, Any] = headers.job_map(
        epoch=1,
        tensors=TENSORS,
        chunk_bytes=CHUNK_BYTES,
        owners=[0, 1, 0],
        servers=[server.address, "inproc://elsewhere"],
        opt={"cls": "Adam", "mode": "server", "groups": [{"lr": 0.01, "betas": [0.9, 0.99]}]},
        workers=[0, 1],
        batching="equal",
        consistency="bsp",
        report_s=1.0,
        time_servers=False,
        consistency_args={},
    )
    server._control({**job_map, "i": 0})
    worker = fabric.transport()
    for cid in (0, 2):
        value = as_bytes(torch.arange(NUMELS[cid], dtype=torch.float32))
        init = headers.init(chunk=cid, epoch=1, dtype="float32", numel=NUMELS[cid])
        deliver(server, worker, {**init, "j": JOB, "i": 1, "r": 0, "t": cred(0)}, [value])
    push = headers.push(
        chunk=0, epoch=1, rank=1, clock=0, weight=1.0, version=0, dtype="float32", numel=NUMELS[0]
    )
    grad = as_bytes(torch.ones(NUMELS[0]))
    deliver(server, worker, {**push, "j": JOB, "i": 2, "t": cred(1)}, [grad])
    server._control({**job_map, "o": int(Control.MIGRATE), "epoch": 2, "owners": [0, 0, 0]})
    while worker.recv(0) is not None:
        pass
    assert server._store.chunks[0].arrived == {1} and server._store.chunks[2].seeded
    return server, fabric, worker


def cred(rank: int) -> bytes:
    return credential(KEY, JOB, WORKER, rank)


def deliver(server: Server, sender: Any, header: dict[str, Any], frames: list[Any]) -> None:
    """Send from ``sender`` and have the server handle it (what its loop would do)."""
    sender.send(sender.connect(server.address), [encode(header), *frames])
    env = server._transport.recv(0)
    assert env is not None
    server._serve(env.peer, env.frames, None)


def checksum(server: Server) -> str:
    """Everything a message could change: chunks (values, optimizer state, versions,
    rounds, arrivals), the map, the moves, what is held."""
    store, handover = server._store, server._handover
    h = hashlib.sha256()
    for cid, ch in sorted(store.chunks.items()):
        h.update(bytes(ch.value_bytes))
        h.update(repr((cid, ch.version, ch.round, sorted(ch.arrived), len(ch.waiting))).encode())
        h.update(
            repr((ch.pushes, ch.seeded, ch.weight_sum, sorted(ch.last_clock.items()))).encode()
        )
        if ch.optimizer is not None:
            for key, v in sorted(ch.optimizer.optimizer.state.get(ch.optimizer.param, {}).items()):
                h.update(key.encode() + (bytes(as_bytes(v.reshape(-1))) if v.numel() else b""))
    moves = sorted((c, m.phase.value, len(m.queued), m.source) for c, m in handover.moves.items())
    h.update(repr((store.epoch, store.owners, moves, len(handover.early))).encode())
    h.update(repr((handover.early_bytes, handover.moved_in, server.state)).encode())
    return h.hexdigest()


def replies(worker: Any) -> list[dict[str, Any]]:
    out = []
    while (env := worker.recv(0)) is not None:
        out.append(msgpack.unpackb(env.frames[0]))
    return out


#: Header keys of the data plane, with plausible values often and anything sometimes.
plausible = {
    "c": st.sampled_from([0, 1, 2, 3, -1, 10**6]) | values,
    "e": st.sampled_from([0, 1, 2, 3]) | values,
    "r": st.sampled_from([0, 1, 2, -1]) | values,
    "k": st.sampled_from([0, 1, 5]) | values,
    "w": st.sampled_from([1.0, 0.5, 0.0, -1.0, float("nan"), float("inf")]) | values,
    "v": st.sampled_from([0, 1]) | values,
    "dt": st.sampled_from(["float32", "float16", "int8", "float64"]) | values,
    "n": st.sampled_from([*NUMELS, 0, 151, 2**40]) | values,
    "sm": st.lists(values, max_size=3)
    | st.tuples(
        st.sampled_from([job_prefix(JOB) + "w0-1-x", job_prefix(JOB) + "w1-1", "other"]),
        st.integers(-8, 2048),
        st.integers(-8, 2048),
    ).map(list),
    "b": st.binary(max_size=1100) | values,
    "z": st.booleans() | values,
    "hp": st.dictionaries(st.sampled_from(["lr", "betas", "eps", "x"]), values, max_size=3),
    "p": st.lists(st.integers(-2, 5), max_size=4) | values,
    "st": st.dictionaries(st.text(max_size=6), values, max_size=3),
    "s": st.sampled_from([0, 1, 2, -1]) | values,
    "ad": st.sampled_from([0, 1, 2]) | values,
    "g": st.binary(min_size=16, max_size=16) | values,
    "gm": st.sampled_from([0, 1, -1]) | values,  # PULL: a round's mean gradient
}


@st.composite
def data_messages(draw: st.DrawFn, credentials: bool) -> tuple[dict[str, Any], list[bytes]]:
    op = draw(st.sampled_from(DATA_OPS) | st.integers(-3, 100))
    header: dict[str, Any] = {"o": op, "j": JOB, "i": draw(st.integers(0, 2**31))}
    for key in draw(st.lists(st.sampled_from(sorted(plausible)), max_size=10, unique=True)):
        header[key] = draw(plausible[key])
    if draw(st.booleans()):
        header.update(draw(headers_of(JOB, keys=["t", "x", "o", "j"])))
    if credentials:
        who = draw(st.sampled_from(["worker 0", "worker 1", "server 1", "none"]))
        if who.startswith("worker"):
            rank = int(who[-1])
            header.update(r=rank, t=cred(rank))
        elif who == "server 1":
            header.update(s=1, t=credential(KEY, JOB, SERVER, 1))
    sizes = [4 * n for n in NUMELS] + [2 * n for n in NUMELS]
    return header, draw(frames(sizes))


@given(st.lists(data_messages(credentials=False), min_size=1, max_size=4))
def test_a_peer_without_a_credential_changes_nothing(messages: list[Any]) -> None:
    server, _, worker = a_server()
    before = checksum(server)
    for header, fs in messages:
        try:
            wire = encode(header)
        except (TypeError, ValueError, OverflowError):
            continue
        worker.send(worker.connect(server.address), [wire, *fs])
        env = server._transport.recv(0)
        server._serve(env.peer, env.frames, None)
        for reply in replies(worker):
            assert reply["o"] == int(Data.ERROR), reply
            assert reply["code"] != "internal", reply
        assert checksum(server) == before, header


@given(st.lists(data_messages(credentials=True), min_size=1, max_size=4))
def test_an_insider_cannot_break_the_server(messages: list[Any]) -> None:
    server, _, worker = a_server()
    for header, fs in messages:
        try:
            wire = encode(header)
        except (TypeError, ValueError, OverflowError):
            continue
        before = checksum(server)
        worker.send(worker.connect(server.address), [wire, *fs])
        env = server._transport.recv(0)
        server._serve(env.peer, env.frames, None)
        got = replies(worker)
        for reply in got:
            assert reply["code"] != "internal" if reply["o"] == int(Data.ERROR) else True, reply
        if got and all(r["o"] == int(Data.ERROR) for r in got):
            assert checksum(server) == before, (header, got)
    assert server._abort is None and not server._stop


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    logger = logging.getLogger("trimtab")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # every refusal logs a warning
    yield
    logger.setLevel(level)
