"""The servers' row path without sockets: row pushes into a table's chunks (a row
straddling two chunks), torch's sparse optimizer semantics per chunk, bad row pushes
refused with nothing changed, and a table's chunks checkpointed and restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.test_checkpoints import Loop, settle
from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import Data
from trimtab.roles.server.checkpoint import ServerCheckpoints, file_name
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.slots import SharedArenas
from trimtab.roles.server.store import ChunkStore
from trimtab.runtime.rows import split
from trimtab.runtime.tensors import as_bytes

ROWS, WIDTH = 5, 4  # 20 elements in chunks of 7, 7, 6: rows 1 and 3 straddle two
OPT = {"mode": "server", "cls": "SparseAdam", "groups": [{"lr": 0.1}]}
WHOLE = 32  # chunk bytes for chunks of 8, 8, 4 elements: whole rows (a row view steps)


def table_store(chunk_bytes: int = 28, cls: str = "SparseAdam") -> ChunkStore:
    store = ChunkStore(LoadMeter(), SharedArenas("job"))
    store.index = 0
    store.apply_map(
        {
            "tensors": [["emb", [ROWS, WIDTH], "float32", 0]],
            "chunk_bytes": chunk_bytes,
            "workers": [0, 1],
            "servers": ["inproc://s0"],
            "opt": {**OPT, "cls": cls},
            "owners": [0, 0, 0],
            "epoch": 1,
            "consistency": "bsp",
        }
    )
    return store


def row_grad(rows: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(len(rows), WIDTH, generator=g)
    return torch.sparse_coo_tensor(
        torch.tensor([rows]), values, (ROWS, WIDTH), check_invariants=True
    )


def push_rows(
    store: ChunkStore, rank: int, grad: torch.Tensor, clock: int, hot: list[int] | None = None
) -> list[Any]:
    """Rank ``rank``'s row pushes of ``grad`` to every chunk; the replies released.
    ``hot``: the worker's hot set, told (a list of rows; [] says the version only)."""
    specs = [store.chunks[c].spec for c in sorted(store.chunks)]
    out: list[Any] = []
    for spec, (ids, values) in zip(
        specs, split(grad, [(WIDTH, s.offset, s.numel) for s in specs]), strict=True
    ):
        header = {"o": int(Data.PUSH), "i": rank, "c": spec.id, "e": 1, "r": rank, "k": clock,
                  "w": 1.0, "dt": "float32", "n": values.numel(), "sr": ids.numel()}  # fmt: skip
        frames = [as_bytes(ids), as_bytes(values)] if ids.numel() else []
        if hot is not None:
            header["hf"] = 1
            first, end = spec.offset // WIDTH, -(-(spec.offset + spec.numel) // WIDTH)
            mine = torch.tensor([r for r in hot if first <= r < end], dtype=torch.int64)
            if hot:
                header["hs"] = mine.numel()
                frames += [as_bytes(mine)] if mine.numel() else []
        out.extend(store.push(b"peer%d" % rank, header, frames, False))
    return out


def table_of(store: ChunkStore) -> torch.Tensor:
    return torch.cat([store.chunks[c].value for c in sorted(store.chunks)]).view(ROWS, WIDTH)


@pytest.mark.parametrize("cls", ["SparseAdam", "Adagrad", "SGD"])
@pytest.mark.parametrize("chunk_bytes", [28, WHOLE], ids=["rows-cut", "whole-rows"])
def test_rows_across_chunks_step_as_torchs_optimizers_on_the_whole_table(
    chunk_bytes: int, cls: str
) -> None:
    """torch's sparse optimizers on a table's chunks: rows cut in two by chunks, or
    chunks of whole rows (stepped on a row view of the chunk), as on the whole table."""
    store = table_store(chunk_bytes, cls)
    reference = torch.nn.Parameter(torch.zeros(ROWS, WIDTH))
    optimizer = getattr(torch.optim, cls)([reference], lr=0.1)
    for clock, (a, b) in enumerate([([1, 3], [3, 4]), ([0], [1, 2]), ([4], [4])]):
        ga, gb = row_grad(a, clock), row_grad(b, 100 + clock)
        assert push_rows(store, 0, ga, clock) == []  # waits for worker 1
        replies = push_rows(store, 1, gb, clock)
        reference.grad = (ga + gb) / 2  # the mean, as the servers weigh equal batches
        optimizer.step()
        assert torch.allclose(table_of(store), reference.detach(), atol=1e-6)
        for c in store.chunks.values():  # (the state keeps the chunk's shape)
            assert c.value.shape == (c.spec.numel,)
            state = c.optimizer.optimizer.state[c.optimizer.param]
            assert all(v.dim() <= 1 for v in state.values() if isinstance(v, torch.Tensor))
        # Each answer names the rows that changed in its chunk, with their new elements.
        changed = sorted({int(r) for reply in replies for r in reply.rows.tolist()})
        assert changed == sorted(set(a) | set(b))


def test_a_bad_row_push_is_refused_and_changes_nothing() -> None:
    store = table_store()
    spec = store.chunks[0].spec  # rows 0 and 1 (elements 0..6)
    base = {"o": int(Data.PUSH), "i": 1, "c": 0, "e": 1, "r": 0, "k": 0, "w": 1.0,
            "dt": "float32"}  # fmt: skip
    cases = [
        (torch.tensor([2]), 4, "row ids must lie there"),  # row 2 starts at element 8
        (torch.tensor([1, 0]), 7, "strictly increasing"),
        (torch.tensor([0]), 3, "hold 4 elements"),
    ]
    for ids, n, why in cases:
        header = {**base, "n": n, "sr": ids.numel()}
        frames = [as_bytes(ids), as_bytes(torch.zeros(n))]
        with pytest.raises(ProtocolError, match=why):
            store.push(b"peer0", header, frames, False)
    chunk = store.chunks[spec.id]
    assert chunk.rows is None and not chunk.arrived and chunk.pushes == 0


def test_a_tables_chunks_checkpoint_and_restore_with_their_optimizer_state(tmp_path: Path) -> None:
    store = table_store()
    ckpt = ServerCheckpoints(store, Loop(), b"coordinator")  # type: ignore[arg-type]
    push_rows(store, 0, row_grad([1, 3], 0), 0)
    push_rows(store, 1, row_grad([2], 1), 0)
    ckpt.control(headers.snapshot(number=1, clock=1, directory=str(tmp_path)))  # type: ignore[arg-type]
    settle(ckpt)
    fresh = ChunkStore(LoadMeter(), SharedArenas("job"))
    fresh.index = 0
    said = Loop()
    loading = ServerCheckpoints(fresh, said, b"coordinator")  # type: ignore[arg-type]
    loading.control(headers.restore(directory=str(tmp_path), files=[file_name(0)]))  # type: ignore[arg-type]
    fresh.apply_map(table_store().job | {"owners": [0, 0, 0], "epoch": 1})  # type: ignore[arg-type]
    loading.mapped()
    assert said.sent == [headers.restored(chunks=3)]
    assert torch.equal(table_of(fresh), table_of(store))
    for s in (store, fresh):  # the next step from both: SparseAdam's moments came back
        push_rows(s, 0, row_grad([1, 4], 2), 1)
        push_rows(s, 1, row_grad([3], 3), 1)
    assert torch.equal(table_of(fresh), table_of(store))
    assert fresh.chunks[0].optimizer is not None
