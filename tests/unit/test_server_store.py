"""The server's chunk store on its own: no transport, no threads. A push is validated,
merged with its weight, and the round's update returns the replies to send."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trimtab.errors import ChunkMoved, ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import Data
from trimtab.roles.server.lifecycle import ChunkPhase, Move
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.slots import SharedArenas
from trimtab.roles.server.state import load_state, state_reply
from trimtab.roles.server.store import ChunkStore, mean_of
from trimtab.runtime.tensors import as_bytes

WORKERS = [0, 1]


def map_header(
    owners: list[int], *, mode: str = "summation", consistency: str = "bsp", **more: Any
) -> dict[str, Any]:
    """A MAP for one float32 tensor of 8 elements cut into two chunks of 4."""
    return {
        "tensors": [["w", [8], "float32", 0]],
        "chunk_bytes": 16,
        "workers": WORKERS,
        "servers": ["inproc://s0", "inproc://s1"],
        "opt": {"mode": mode, "cls": "SGD", "groups": [{"lr": 0.5}]},
        "owners": owners,
        "epoch": 1,
        "consistency": consistency,
        **more,
    }


def store_of(index: int = 0, **header: Any) -> ChunkStore:
    store = ChunkStore(LoadMeter(), SharedArenas("job"))
    store.index = index
    store.apply_map(map_header(header.pop("owners", [0, 1]), **header))
    return store


def push(
    store: ChunkStore, rank: int, grad: list[float], *, chunk: int = 0, clock: int = 0, w: float = 1
) -> list[Any]:
    header = {
        "o": int(Data.PUSH),
        "i": 10 + rank,
        "c": chunk,
        "e": 1,
        "r": rank,
        "k": clock,
        "w": w,
        "dt": "float32",
        "n": len(grad),
    }
    frame = as_bytes(torch.tensor(grad, dtype=torch.float32))
    return list(store.push(b"peer%d" % rank, header, [frame], False))


def test_the_store_holds_the_chunks_its_map_gives_it() -> None:
    store = store_of(index=1)
    assert list(store.chunks) == [1] and store.chunks[1].spec.numel == 4
    with pytest.raises(ChunkMoved) as moved:
        store.owned(0)
    assert (moved.value.chunk, moved.value.owner, moved.value.epoch) == (0, 0, 1)
    with pytest.raises(ProtocolError, match="no chunk 7"):
        store.owned(7)


def test_a_round_completes_with_the_weighted_mean_and_replies_to_every_pusher() -> None:
    store = store_of()
    assert push(store, 0, [1, 2, 3, 4], w=1) == []  # waits for worker 1
    replies = push(store, 1, [4, 8, 12, 16], w=3)
    chunk = store.chunks[0]
    assert [(r.peer, r.rid, r.round) for r in replies] == [(b"peer0", 10, 0), (b"peer1", 11, 0)]
    # Summation mode: the reply is the merge buffer itself, (1*g0 + 3*g1) / 4, not a copy.
    assert all(r.value is chunk.merge for r in replies)
    assert chunk.merge.tolist() == [3.25, 6.5, 9.75, 13.0]
    assert (chunk.version, chunk.round, store.meter.step) == (1, 1, 1)
    assert store.stats()["pushes"] == 2 and not chunk.arrived and not chunk.waiting


def test_server_mode_applies_the_optimizer_to_the_value() -> None:
    store = store_of(mode="server")
    push(store, 0, [1, 1, 1, 1])
    replies = push(store, 1, [3, 3, 3, 3])
    value = store.chunks[0].value
    assert replies[0].value is value and value.tolist() == [-1.0] * 4  # 0 - 0.5 * 2


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"r": 9}, "bad_state"),  # not a worker of this job
        ({"w": 0}, "malformed"),
        ({"n": 3}, "bad_shape"),
        ({"dt": "int64"}, "bad_dtype"),
        ({"hp": 3}, "malformed"),
        ({"k": "x"}, "malformed"),
        ({"e": None}, "malformed"),  # the map it was routed by: PushHeader requires it
        ({"z": 1}, "malformed"),  # a bool
        ({"sm": None}, "malformed"),
        ({"c": 7, "v": "x"}, "malformed"),  # every key's type before the chunk
    ],
)
def test_a_bad_push_is_refused_before_anything_changes(change: dict[str, Any], code: str) -> None:
    store = store_of()
    header = {
        "o": int(Data.PUSH),
        "i": 1,
        "c": 0,
        "e": 1,
        "r": 0,
        "k": 0,
        "w": 1,
        "dt": "float32",
        "n": 4,
        **change,
    }
    with pytest.raises(ProtocolError) as refused:
        store.push(b"p", header, [as_bytes(torch.ones(4))], False)
    assert refused.value.args[0] == code
    chunk = store.chunks[0]
    assert (chunk.pushes, chunk.arrived, chunk.waiting) == (0, set(), [])


def test_a_second_push_of_one_round_is_refused() -> None:
    store = store_of()
    push(store, 0, [1, 1, 1, 1])
    with pytest.raises(ProtocolError, match="already pushed"):
        push(store, 0, [1, 1, 1, 1])


def test_a_leaving_chunk_takes_pushes_before_its_cut_and_moves_the_rest() -> None:
    store = store_of()
    store.moves[0] = Move(0, ChunkPhase.LEAVING, cut=1, owner=1)
    push(store, 0, [1, 1, 1, 1], clock=0)  # before the cut: merged here
    with pytest.raises(ChunkMoved) as moved:
        push(store, 1, [1, 1, 1, 1], clock=1)
    assert moved.value.owner == 1


def test_asynchronous_replies_carry_a_snapshot_and_ssp_holds_the_fast_worker() -> None:
    store = store_of(consistency="ssp", consistency_args={"staleness": 0})
    first = push(store, 0, [1, 1, 1, 1], clock=0)
    assert first == []  # worker 0 is ahead of worker 1 by more than 0 clocks: held
    assert store.stats()["held"] == 1
    second = push(store, 1, [1, 1, 1, 1], clock=0)
    assert {r.rank for r in second} == {0, 1}  # worker 1 caught up: both go
    assert second[0].value is not store.chunks[0].merge  # a copy: the buffer moves on


def test_the_meter_counts_in_one_place() -> None:
    meter = LoadMeter()
    meter.served(0.5, 100)
    meter.count(20)
    meter.stalled(0.25)
    assert (meter.busy_s, meter.bytes, meter.requests) == (0.75, 120, 1)
    assert meter.advance(3) and not meter.advance(2) and meter.step == 3


def test_state_set_and_get_round_trip_and_bad_state_changes_nothing() -> None:
    """STATE_SET replaces a chunk's optimizer state (and value); STATE_GET reads it back;
    a state of the wrong size is refused before anything changes; in summation mode
    both are refused (the state lives on the workers)."""
    store = store_of(
        mode="server",
        opt={"mode": "server", "cls": "SGD", "groups": [{"lr": 0.5, "momentum": 0.9}]},
    )
    momentum = torch.arange(4, dtype=torch.float32)
    value = torch.full((4,), 7.0)
    meta = {"momentum_buffer": ["t", "float32", [4]]}
    header = dict(headers.state_set(chunk=0, epoch=1, state=meta, dtype="float32", numel=4))
    header["i"] = 3
    load_state(store, header, [as_bytes(value), as_bytes(momentum)])
    assert torch.equal(store.chunks[0].value, value)
    reply, frames = state_reply(store, {**headers.state_get(chunk=0, epoch=1), "i": 4})
    assert reply["st"] == meta and reply["i"] == 4
    assert torch.equal(torch.frombuffer(bytearray(frames[0]), dtype=torch.float32), momentum)
    bad = dict(
        headers.state_set(chunk=0, epoch=1, state={"momentum_buffer": ["t", "float32", [3]]})
    )
    with pytest.raises(ProtocolError, match="shape"):
        load_state(store, bad, [as_bytes(torch.zeros(3))])
    _, frames = state_reply(store, {**headers.state_get(chunk=0, epoch=1), "i": 5})
    assert torch.equal(torch.frombuffer(bytearray(frames[0]), dtype=torch.float32), momentum)
    load_state(store, dict(headers.state_set(chunk=0, epoch=1, state={})), [])
    assert state_reply(store, {**headers.state_get(chunk=0, epoch=1), "i": 6})[0]["st"] == {}
    with pytest.raises(ProtocolError, match="summation mode"):
        state_reply(store_of(), {**headers.state_get(chunk=0, epoch=1), "i": 7})


def test_a_mean_only_round_answers_the_mean_and_sum_scales_it() -> None:
    """A PUSH with g answers the round's mean gradient and applies nothing, even in
    server mode; with op=Sum the answer is the number of workers times the mean."""
    opt = {"mode": "server", "cls": "SGD", "groups": [{"lr": 0.5}], "op": "sum"}
    store = store_of(mode="server", opt=opt)
    for rank, grad in ((0, [1.0, 2.0, 3.0, 4.0]), (1, [3.0, 2.0, 1.0, 0.0])):
        header = {
            "o": int(Data.PUSH),
            "i": 1,
            "c": 0,
            "e": 1,
            "r": rank,
            "k": 0,
            "w": 1,
            "dt": "float32",
            "n": 4,
            "g": True,
        }
        replies = store.push(b"p", header, [as_bytes(torch.tensor(grad))], False)
    assert torch.equal(replies[0].value, torch.tensor([4.0, 4.0, 4.0, 4.0]))
    assert torch.equal(store.chunks[0].value, torch.zeros(4))  # nothing applied


def _empty_push(store: ChunkStore, rank: int, clock: int) -> list[Any]:
    header = {"o": int(Data.PUSH), "i": 1, "c": 0, "e": 1, "r": rank, "k": clock, "w": 1}
    header.update({"dt": "float32", "n": 4, "z": True})
    return list(store.push(b"p", header, [], False))


def test_server_mode_keeps_each_rounds_mean_until_the_next_round_applies() -> None:
    """Under BSP in server mode the mean a round applied stays readable (a PULL with gm:
    Horovod's .grad after step()) while the next round merges into the other buffer,
    with no copy; once that round applies, the older mean is refused, never wrong."""
    store = store_of(mode="server")
    chunk = store.chunks[0]
    push(store, 0, [1, 1, 1, 1], w=1)
    push(store, 1, [5, 5, 5, 5], w=3)  # round 0: the weighted mean is 4
    assert mean_of(chunk, 0).tolist() == [4.0] * 4  # type: ignore[union-attr]
    kept = mean_of(chunk, 0)
    push(store, 0, [2, 2, 2, 2], clock=1)  # round 1 merges elsewhere: round 0's stays
    assert kept is not chunk.merge and mean_of(chunk, 0).tolist() == [4.0] * 4  # type: ignore[union-attr]
    push(store, 1, [4, 4, 4, 4], clock=1)
    assert mean_of(chunk, 1).tolist() == [3.0] * 4  # type: ignore[union-attr]
    assert chunk.merge is kept  # the two buffers take turns: round 2 merges into it
    for gone in (0, 2, -1):
        with pytest.raises(ProtocolError, match="not held here") as refused:
            mean_of(chunk, gone)
        assert refused.value.args[0] == "bad_state"
    _empty_push(store, 0, 2)
    _empty_push(store, 1, 2)  # round 2: no worker had a gradient
    assert mean_of(chunk, 2) is None


@pytest.mark.parametrize(("mode", "consistency"), [("summation", "bsp"), ("server", "ssp")])
def test_no_mean_is_kept_where_grad_is_not_the_servers(mode: str, consistency: str) -> None:
    """Summation mode answers the mean itself, and asynchronous modes have no one mean
    a step applied: nothing is kept, and a PULL with gm is refused."""
    store = store_of(mode=mode, consistency=consistency, staleness=2)
    push(store, 0, [1, 1, 1, 1])
    push(store, 1, [3, 3, 3, 3])
    assert store.chunks[0].last_mean is None
    with pytest.raises(ProtocolError, match="not held here"):
        mean_of(store.chunks[0], 0)
