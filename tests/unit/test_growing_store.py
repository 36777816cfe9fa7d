"""A growing table's chunks on a server, without sockets: reads that map ids to rows and
start them afresh (values and optimizer state), bad reads refused with nothing changed,
and the id map carried by a migration's state, a checkpoint and its restore (but not by
a worker's STATE_GET)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.test_checkpoints import Loop, settle
from trimtab.errors import ProtocolError
from trimtab.policies.growth import Growth
from trimtab.protocol import headers
from trimtab.protocol.messages import Data
from trimtab.roles.server.checkpoint import ServerCheckpoints, file_name
from trimtab.roles.server.growing import fresh_row
from trimtab.roles.server.handover import decode_state, encode_state
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.optim import ChunkOptimizer
from trimtab.roles.server.slots import SharedArenas
from trimtab.roles.server.state import load_state, state_reply
from trimtab.roles.server.store import ChunkStore
from trimtab.runtime.tensors import as_bytes

ROWS, WIDTH = 8, 4  # chunks of 32 bytes: 4 chunks of 2 whole rows
RULES = Growth(admit_after=1, ttl_steps=2)
OPT = {
    "mode": "server",
    "cls": "Adagrad",
    "groups": [{"lr": 0.1, "initial_accumulator_value": 0.5}],
}
JOB = {
    "tensors": [["emb", [ROWS, WIDTH], "float32", 0]],
    "chunk_bytes": 32,
    "workers": [0],
    "servers": ["inproc://s0"],
    "opt": OPT,
    "owners": [0, 0, 0, 0],
    "epoch": 1,
    "consistency": "bsp",
}


def store_of() -> ChunkStore:
    store = ChunkStore(LoadMeter(), SharedArenas("job"))
    store.index = 0
    store.apply_map(JOB)  # type: ignore[arg-type]
    return store


def read(store: ChunkStore, keys: list[int], gw: Any = None) -> tuple[list[int], torch.Tensor]:
    header: Any = headers.pull(chunk=1, epoch=1)
    header["sr"] = len(keys)
    header["gw"] = gw if gw is not None else [RULES.to_wire(), 2, 7, [0.0, 1.0]]
    reply = store.pull_rows(b"p", 1, headers.read_pull(header), [as_bytes(torch.tensor(keys))])
    assert reply.rows is not None and reply.value is not None
    return reply.rows.tolist(), reply.value.view(-1, WIDTH).clone()


def push(store: ChunkStore, row: int, clock: int) -> None:
    """One worker's gradient of ones for ``row`` of chunk 1: completes the round."""
    ids, values = torch.tensor([row]), torch.ones(WIDTH)
    header = {"o": int(Data.PUSH), "i": clock, "c": 1, "e": 1, "r": 0, "k": clock,
              "w": 1.0, "dt": "float32", "n": WIDTH, "sr": 1}  # fmt: skip
    store.push(b"p", header, [as_bytes(ids), as_bytes(values)], False)


def accumulator(store: ChunkStore, row: int) -> torch.Tensor:
    opt = store.chunks[1].optimizer
    assert opt is not None
    at = row * WIDTH - store.chunks[1].spec.offset
    return opt.optimizer.state[opt.param]["sum"][at : at + WIDTH]


def test_an_evicted_id_comes_back_with_fresh_values_and_optimizer_state() -> None:
    store = store_of()
    big = (1 << 63) - 5
    fresh = fresh_row(7, big, WIDTH, 0.0, 1.0)
    rows, values = read(store, [-3, big])
    assert rows == [2, 3]  # chunk 1 holds rows 2 and 3
    assert torch.equal(values[1], fresh)
    push(store, 3, 0)
    push(store, 3, 1)
    assert not torch.equal(read(store, [big])[1][0], fresh)  # trained (read at round 2)
    assert bool((accumulator(store, 3) > 0.5).all())
    for clock in (2, 3, 4):
        push(store, 3, clock)
    # Round 5: -3 unseen since round 0, big since 2: both past 2 steps, both evicted.
    rows, values = read(store, [-3, big])
    assert rows == [3, 2] and store.stats()["growing"]["evicted"] == 2
    assert torch.equal(values[1], fresh)  # a new row: its values drawn afresh ...
    assert torch.equal(accumulator(store, 3), torch.full((WIDTH,), 0.5))  # ... its state too


@pytest.mark.parametrize(
    ("keys", "gw", "match"),
    [
        ([5, 4], None, "strictly increasing"),
        ([5], [[0, 1.0, 0, 0, 0], 2, 7, [0.0, 1.0]], "admit_after must be at least 1"),
        ([5], [RULES.to_wire(), 2, 7], r"'gw' is \[growth"),
    ],
)
def test_a_bad_growing_read_is_refused_and_changes_nothing(
    keys: list[int], gw: Any, match: str
) -> None:
    store = store_of()
    read(store, [9])
    before = store.stats()["growing"]
    with pytest.raises(ProtocolError, match=match):
        read(store, keys, gw)
    assert store.stats()["growing"] == before


def test_a_chunk_growing_by_other_rules_refuses_the_read() -> None:
    store = store_of()
    read(store, [9])
    with pytest.raises(ProtocolError, match="other rules"):
        read(store, [9], [Growth(admit_after=3).to_wire(), 2, 7, [0.0, 1.0]])


def test_the_map_moves_with_the_chunks_state_but_not_to_a_worker() -> None:
    store = store_of()
    read(store, [11, 12])
    opt = store.chunks[1].optimizer
    assert opt is not None
    frames: list[Any] = []
    hp, meta = encode_state(opt, frames)
    moved = ChunkOptimizer("Adagrad", torch.zeros(8), OPT["groups"][0])  # type: ignore[index]
    decode_state(moved, {"hp": hp, "st": meta}, [memoryview(f) for f in frames])  # type: ignore[arg-type]
    assert moved.grown.map.export() == opt.grown.map.export()
    assert "sum" in moved.optimizer.state[moved.param]
    reply, _ = state_reply(store, {"o": int(Data.STATE_GET), "i": 1, "c": 1, "e": 1})
    assert not any(k.startswith("grow.") for k in reply["st"])
    # A worker's state (no map) leaves the map as it is.
    header = {"o": int(Data.STATE_SET), "i": 2, "c": 1, "e": 1, "st": {}}
    load_state(store, header, [])
    assert opt.grown.map.live == 2


def test_a_growing_tables_map_is_checkpointed_and_restored(tmp_path: Path) -> None:
    store = store_of()
    read(store, [21, 22])
    ckpt = ServerCheckpoints(store, Loop(), b"coordinator")  # type: ignore[arg-type]
    ckpt.control(headers.snapshot(number=1, clock=0, directory=str(tmp_path)))  # type: ignore[arg-type]
    settle(ckpt)
    fresh = ChunkStore(LoadMeter(), SharedArenas("job"))
    fresh.index = 0
    loading = ServerCheckpoints(fresh, Loop(), b"coordinator")  # type: ignore[arg-type]
    loading.control(headers.restore(directory=str(tmp_path), files=[file_name(0)]))  # type: ignore[arg-type]
    fresh.apply_map(JOB | {"epoch": 2})  # type: ignore[arg-type]
    loading.mapped()
    assert fresh.stats()["growing"] == store.stats()["growing"]
    (rows, values), (rows_before, values_before) = (read(s, [21, 22, 30]) for s in (fresh, store))
    assert rows == rows_before == [2, 3, -1]  # (the cap of 2: 30 finds no room)
    assert torch.equal(values, values_before)


def test_the_counters_reach_the_load_report_and_the_metrics() -> None:
    pytest.importorskip("prometheus_client")
    from trimtab.observe.metrics import Metrics
    from trimtab.roles.server.growing import totals

    store = store_of()
    read(store, [1, 2, 3])  # a cap of 2: 3 finds no room
    grown = totals(store.chunks.values())
    assert grown == {"admitted": 2, "refused": 1, "evicted": 0, "evicted_for_cap": 0,
                     "full": 1, "live": 2}  # fmt: skip
    load = headers.load(busy_s=1.0, nbytes=10, requests=3, step=0)
    load["gr"] = grown
    assert headers.read_load(dict(load))["gr"] == grown
    metrics = Metrics()
    metrics({"kind": "load", "server": 1, "busy_s": 1.0, "bytes": 10, "requests": 3,
             "speed": None, "growing": grown})  # fmt: skip
    text = metrics.exposition().decode()
    assert 'trimtab_server_growing_rows{count="live",server="1"} 2.0' in text
    assert 'trimtab_server_growing_rows{count="full",server="1"} 1.0' in text
