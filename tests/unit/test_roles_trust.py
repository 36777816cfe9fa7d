"""What each role trusts, piece by piece: credentials, the seeding INIT, a worker's own
arena, what a peer may keep waiting at the coordinator, early handovers."""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_server_store import store_of
from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.roles.coordinator.collectives import MAX_WAITING_PER_PEER, Collectives
from trimtab.roles.server.handover import EARLY_MAX, Handover
from trimtab.runtime.credentials import (
    SERVER,
    WORKER,
    Credentials,
    adoption_grant,
    credential,
    new_key,
)
from trimtab.runtime.tensors import as_bytes
from trimtab.transport.shm import job_prefix


def code_of(exc: pytest.ExceptionInfo[ProtocolError]) -> str:
    return str(exc.value.args[0])


def test_credentials_name_one_role_and_rank_of_one_job() -> None:
    key = new_key()
    creds = Credentials("job")
    with pytest.raises(ProtocolError):  # nothing is trusted before REGISTERED
        creds.worker({"o": 65, "r": 0, "t": credential(key, "job", WORKER, 0)})
    creds.learn(key, 2, None)
    assert creds.worker({"o": 65, "r": 1, "t": credential(key, "job", WORKER, 1)}) == 1
    # A worker that joined the running job (rank 2 of a job started with 2) holds the
    # credential the coordinator issued it: a server that never heard of it takes it.
    assert creds.worker({"o": 65, "r": 2, "t": credential(key, "job", WORKER, 2)}) == 2
    assert creds.server({"o": 72, "s": 3, "t": credential(key, "job", SERVER, 3)}) == 3
    for bad in [
        {"r": 0, "t": credential(key, "job", WORKER, 1)},  # another rank's
        {"r": 0, "t": credential(key, "other", WORKER, 0)},  # another job's
        {"r": 0, "t": credential(new_key(), "job", WORKER, 0)},  # another key's
        {"r": 0, "t": credential(key, "job", SERVER, 0)},  # another role's
        {"r": 1 << 20, "t": credential(key, "job", WORKER, 1 << 20)},  # no rank a job has
        {"r": 0},
        {"r": True, "t": credential(key, "job", WORKER, 1)},
        {"r": 0, "t": "text"},
    ]:
        with pytest.raises(ProtocolError) as exc:
            creds.worker({"o": 65, **bad})
        assert code_of(exc) == "forbidden"
    with pytest.raises(ProtocolError, match="server's"):
        creds.server({"o": 72, "s": 0, "t": credential(key, "job", WORKER, 0)})


def init(store, rank: int, value: float, chunk: int = 0) -> None:  # type: ignore[no-untyped-def]
    header = {**headers.init(chunk=chunk, epoch=1, dtype="float32", numel=4), "i": 1}
    store.init(header, [as_bytes(torch.full((4,), value))], rank, None)


def test_init_is_the_roots_once_per_chunk_before_any_push() -> None:
    store = store_of(mode="server")
    with pytest.raises(ProtocolError) as exc:
        init(store, 1, 5.0)
    assert code_of(exc) == "forbidden"
    init(store, headers.SEED_ROOT, 2.0)
    assert store.chunks[0].value.tolist() == [2.0] * 4
    with pytest.raises(ProtocolError, match="only at declaration"):
        init(store, 0, float("nan"))
    assert store.chunks[0].value.tolist() == [2.0] * 4
    fresh = store_of(mode="server")
    fresh.chunks[0].pushes = 1  # trained already (a push merged), never seeded
    with pytest.raises(ProtocolError) as exc:
        init(fresh, 0, 1.0)
    assert code_of(exc) == "bad_state"


def test_a_push_may_name_only_its_workers_arena() -> None:
    store = store_of()
    header = {
        **headers.push(
            chunk=0, epoch=1, rank=0, clock=0, weight=1.0, version=0, dtype="float32", numel=4
        ),
        "i": 1,
        "sm": [f"{job_prefix('job')}w1-1-abc", 0, 64],  # worker 1's arena
    }
    with pytest.raises(ProtocolError, match="not worker 0's arena") as exc:
        store.push(b"p", header, [], False)
    assert code_of(exc) == "forbidden"
    assert store.chunks[0].pushes == 0


def test_a_peer_keeps_only_so_much_waiting_at_the_coordinator() -> None:
    col = Collectives(num_workers=3)
    for n in range(MAX_WAITING_PER_PEER):
        assert col.barrier(b"w0", n, f"b{n}") == []
    with pytest.raises(ProtocolError, match="wait already"):
        col.get(b"w0", 99, 0, "k")
    with pytest.raises(ProtocolError, match="in barrier 'b0' already"):
        col.barrier(b"w0", 100, "b0")
    col.barrier(b"w1", 1, "b0")
    assert [s.peer for s in col.barrier(b"w2", 1, "b0")] == [b"w0", b"w1", b"w2"]
    assert col.get(b"w0", 101, 0, "k") == []  # one was released: room again


def test_early_handovers_are_bounded_in_count() -> None:
    handover = Handover(store_of(), Credentials("job"))
    for _ in range(EARLY_MAX):
        handover.hold_early(b"s", [memoryview(b"x")])
    with pytest.raises(ProtocolError) as exc:
        handover.hold_early(b"s", [memoryview(b"x")])
    assert code_of(exc) == "too_large" and handover.early_bytes == EARLY_MAX
    assert len(handover.take_early()) == EARLY_MAX and handover.early_bytes == 0


def test_an_adoption_is_granted_once_every_worker_asked_and_resets_each_chunk_once() -> None:
    col = Collectives(num_workers=2)
    key = new_key()

    def grant(root: int, n: int) -> bytes:
        return adoption_grant(key, "job", root, n)

    assert col.adopt(b"w0", 1, 1, grant) == []
    with pytest.raises(ProtocolError, match="not worker 0's"):
        col.adopt(b"w1", 2, 0, grant)  # another root than the forming adoption's
    with pytest.raises(ProtocolError, match="already"):
        col.adopt(b"w0", 3, 1, grant)
    sent = col.adopt(b"w1", 4, 1, grant)
    assert [s.header["ad"] for s in sent] == [1, 1]  # type: ignore[union-attr]
    granted = sent[0].header  # type: ignore[union-attr]
    creds = Credentials("job")
    creds.learn(key, 2, None)
    init_header = {**headers.init(chunk=0, epoch=1, dtype="float32", numel=4), "i": 1}
    assert creds.adoption({**init_header, "ad": 1, "g": granted["g"]}, root=1) == 1
    for bad in ({"ad": 1, "g": granted["g"]}, {"ad": 2, "g": granted["g"]}):
        with pytest.raises(ProtocolError) as exc:
            creds.adoption({**init_header, **bad}, root=0 if bad["ad"] == 1 else 1)
        assert code_of(exc) == "forbidden"
    store = store_of(mode="server")
    store.init(init_header, [as_bytes(torch.full((4,), 3.0))], 1, 1)
    assert store.chunks[0].value.tolist() == [3.0] * 4
    with pytest.raises(ProtocolError, match="not newer"):  # a replay of the same grant
        store.init(init_header, [as_bytes(torch.full((4,), 9.0))], 1, 1)
    assert store.chunks[0].value.tolist() == [3.0] * 4
