"""Checkpoints without sockets: a server's chunks taken at a clock and written whole,
loaded back into a fresh server, files refused when damaged, checkpoints found (or
refused) for resuming, and the atomic write that makes a half-written file invisible."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.test_server_store import map_header, push, store_of
from trimtab.errors import ConfigError, ProtocolError
from trimtab.protocol import headers
from trimtab.roles.coordinator import CoordinatorConfig
from trimtab.roles.coordinator.checkpoint import Checkpoints
from trimtab.roles.coordinator.manifest import MANIFEST, find_checkpoint, read_manifest
from trimtab.roles.server.checkpoint import MAGIC, ServerCheckpoints, file_name, read_file
from trimtab.runtime.files import checksum_of, write_atomic
from trimtab.runtime.tensors import as_bytes
from trimtab.settings import CheckpointSettings

SGD = {"mode": "server", "cls": "SGD", "groups": [{"lr": 0.5, "momentum": 0.9}]}


class Loop:
    """What a server's loop sends the coordinator, kept; wakes counted."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.woken = 0
        self.transport = self

    def send(self, peer: Any, header: Any, frames: Any = ()) -> None:
        self.sent.append(dict(header))

    def wake(self) -> None:
        self.woken += 1


def settle(ckpt: ServerCheckpoints) -> None:
    """Let the writing thread finish, then the loop's turn: its answer goes out."""
    ckpt.close()
    ckpt.poll()


def server(owners: tuple[int, int] = (0, 0)) -> tuple[Any, ServerCheckpoints, Loop]:
    store = store_of(owners=list(owners), opt=SGD)
    loop = Loop()
    return store, ServerCheckpoints(store, loop, b"coordinator"), loop  # type: ignore[arg-type]


def step(store: Any, clock: int, chunks: tuple[int, ...] = (0, 1)) -> None:
    for c in chunks:
        push(store, 0, [1.0 + clock, 2, 3, 4], chunk=c, clock=clock)
        push(store, 1, [4, 3.0 - clock, 2, 1], chunk=c, clock=clock, w=3)


def test_chunks_are_taken_at_the_clock_and_load_back_into_a_fresh_server(tmp_path: Path) -> None:
    store, ckpt, loop = server()
    step(store, 0)
    ckpt.control(headers.snapshot(number=1, clock=2, directory=str(tmp_path)))  # type: ignore[arg-type]
    assert loop.sent == []  # every chunk is at round 1: taken once round 1 completes
    step(store, 1, chunks=(0,))
    assert loop.sent == [] and not list(tmp_path.iterdir())
    step(store, 1, chunks=(1,))  # the last chunk reaches clock 2: the file is written
    settle(ckpt)
    assert loop.woken == 1  # the writing thread woke the loop to say so
    digest = checksum_of(tmp_path / file_name(0))  # the file's, as it was written
    assert loop.sent == [
        headers.snapshot_done(number=1, clock=2, file=file_name(0), chunks=2, digest=digest)
    ]
    assert [p.name for p in tmp_path.iterdir()] == [file_name(0)]  # no temporary left
    at_2 = {c: ch.value.clone() for c, ch in store.chunks.items()}
    step(store, 2)  # training goes on; the file holds clock 2

    fresh, loading, said = server()
    loading.control(headers.restore(directory=str(tmp_path), files=[file_name(0)]))  # type: ignore[arg-type]
    fresh.apply_map(map_header([0, 0], opt=SGD))  # the MAP that follows RESTORE
    loading.mapped()
    assert said.sent == [headers.restored(chunks=2)]
    for c, chunk in fresh.chunks.items():
        assert torch.equal(chunk.value, at_2[c]) and (chunk.version, chunk.round) == (2, 2)
    step(fresh, 2)  # the same step from the restored state (momentum included) ...
    for c, chunk in fresh.chunks.items():  # ... gives the very same values
        assert torch.equal(chunk.value, store.chunks[c].value)


def test_a_server_already_past_the_clock_says_so_and_writes_nothing(tmp_path: Path) -> None:
    store, ckpt, loop = server()
    for clock in range(3):
        step(store, clock)
    ckpt.control(headers.snapshot(number=4, clock=1, directory=str(tmp_path)))  # type: ignore[arg-type]
    assert loop.sent == [headers.snapshot_done(number=4, clock=1, late=3)]
    assert not list(tmp_path.iterdir())


def test_a_damaged_file_or_a_missing_chunk_is_refused_on_restore(tmp_path: Path) -> None:
    _, ckpt, _ = server()
    ckpt.control(headers.snapshot(number=1, clock=0, directory=str(tmp_path)))  # type: ignore[arg-type]
    settle(ckpt)
    path = tmp_path / file_name(0)
    assert path.read_bytes().startswith(MAGIC) and len(read_file(path)) == 2
    data = path.read_bytes()
    for bad in (data[:-3], data + b"x", b"not a checkpoint", data[: len(MAGIC) + 4]):
        path.write_bytes(bad)
        with pytest.raises(ProtocolError, match="checkpoint file"):
            read_file(path)
    _, loading, said = server()
    loading.control(headers.restore(directory=str(tmp_path), files=[file_name(0)]))  # type: ignore[arg-type]
    loading.mapped()
    assert "cannot read the checkpoint" in said.sent[0]["err"]
    # A file that lacks a chunk the map gives this server: refused, naming it.
    path.write_bytes(data)
    _, only0, _ = server(owners=(0, 1))
    (tmp_path / "a").mkdir()  # (the coordinator makes a checkpoint's directory)
    only0.control(headers.snapshot(number=1, clock=0, directory=str(tmp_path / "a")))  # type: ignore[arg-type]
    settle(only0)
    _, loading, said = server()
    loading.control(headers.restore(directory=str(tmp_path / "a"), files=[file_name(0)]))  # type: ignore[arg-type]
    loading.mapped()
    assert said.sent == [headers.restored(err="chunk 1 is in none of the checkpoint's files")]


def test_summation_mode_cannot_be_checkpointed_on_the_servers(tmp_path: Path) -> None:
    store = store_of(owners=[0, 0])  # summation mode: the optimizer state is the workers'
    loop = Loop()
    ckpt = ServerCheckpoints(store, loop, b"c")  # type: ignore[arg-type]
    ckpt.control(headers.snapshot(number=1, clock=0, directory=str(tmp_path)))  # type: ignore[arg-type]
    assert "summation mode" in loop.sent[0]["err"]


def test_an_interrupted_atomic_write_leaves_the_old_file_and_no_other(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")

    def parts() -> Any:
        yield b"new, half"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, parts())
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f"]
    write_atomic(path, [b"new", b" whole"])
    assert path.read_bytes() == b"new whole" and [p.name for p in tmp_path.iterdir()] == ["f"]


def _checkpoint(root: Path, clock: int, complete: bool) -> Path:
    d = root / f"ckpt-{clock:08d}"
    d.mkdir(parents=True)
    (d / "server-0.chunks").write_bytes(MAGIC)
    if complete:
        manifest = {"format": 1, "clock": clock, "files": ["server-0.chunks"], "tables": []}
        (d / MANIFEST).write_text(json.dumps({**manifest, "map": {"owners": []}}))
    return d


def test_resuming_takes_the_newest_complete_checkpoint_and_refuses_a_half_written_one(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        find_checkpoint(tmp_path / "none")
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        find_checkpoint(tmp_path)
    half = _checkpoint(tmp_path, 10, complete=False)
    with pytest.raises(ConfigError, match=f"{half.name} has no {MANIFEST}.*never completed"):
        find_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="never completed"):
        find_checkpoint(half)
    five = _checkpoint(tmp_path, 5, complete=True)
    assert find_checkpoint(tmp_path) == five.resolve()  # 10 is not complete
    assert read_manifest(five)["clock"] == 5
    manifest = json.loads((five / MANIFEST).read_text())
    (five / MANIFEST).write_text(json.dumps({**manifest, "chunk_bytes": 512}))
    assert read_manifest(five, 512)["chunk_bytes"] == 512
    with pytest.raises(ConfigError, match=r"chunks of 512 bytes.*--chunk-bytes 512"):
        read_manifest(five, 1024)
    (five / "server-0.chunks").unlink()
    with pytest.raises(ConfigError, match="lacks its files"):
        read_manifest(five)


def test_checkpoint_settings_are_refused_outside_bsp() -> None:
    config = CoordinatorConfig(
        num_workers=1, num_servers=1, job="j", consistency="asp", checkpoint=CheckpointSettings(5)
    )
    with pytest.raises(ConfigError, match="only under --mode bsp, not asp"):
        Checkpoints(config, None, None, None)  # type: ignore[arg-type]


def test_a_server_never_makes_a_checkpoint_directory_given_up(tmp_path: Path) -> None:
    """The coordinator makes each checkpoint's directory and removes one it gives up;
    a server's writer that comes after answers an error and makes nothing (it used to
    make the directory again, and leave it behind, partial)."""
    _, ckpt, loop = server()
    gone = tmp_path / "ckpt-00000000"
    ckpt.control(headers.snapshot(number=1, clock=0, directory=str(gone)))  # type: ignore[arg-type]
    settle(ckpt)
    assert len(loop.sent) == 1 and "is gone (the checkpoint was given up)" in loop.sent[0]["err"]
    assert not gone.exists() and list(tmp_path.iterdir()) == []


def test_a_server_checks_each_file_against_the_manifest_s_checksum_as_it_reads(
    tmp_path: Path,
) -> None:
    """A bit flipped inside a value still parses: only the checksum the RESTORE carries
    (a coordinator started by hand with --resume has no launcher to check first)
    catches it, and the server says so instead of loading it."""
    from trimtab.runtime.files import checksum_of

    _, ckpt, _ = server()
    ckpt.control(headers.snapshot(number=1, clock=0, directory=str(tmp_path)))  # type: ignore[arg-type]
    settle(ckpt)
    path = tmp_path / file_name(0)
    right = checksum_of(path)
    assert len(read_file(path, right)) == 2
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01  # in the last chunk's bytes
    path.write_bytes(bytes(data))
    assert len(read_file(path)) == 2  # unchecked, it reads
    with pytest.raises(ProtocolError, match="checksum"):
        read_file(path, right)
    _, loading, said = server()
    sums = {file_name(0): right}
    restore = headers.restore(directory=str(tmp_path), files=[file_name(0)], sums=sums)
    loading.control(restore)  # type: ignore[arg-type]
    loading.mapped()
    assert "checksum" in said.sent[0]["err"]


def test_a_restored_chunk_takes_the_resumed_jobs_first_adoption(tmp_path: Path) -> None:
    """A resumed job's coordinator numbers its adoptions from 1 again (the stopped job's
    grants name the stopped job, and do not verify): a chunk the stopped job adopted
    takes the resumed job's first broadcast, and still refuses a replay of it."""
    store, ckpt, _ = server()
    init = {**headers.init(chunk=0, epoch=1, dtype="float32", numel=4), "i": 1}
    store.init(init, [as_bytes(torch.full((4,), 3.0))], 0, 1)  # the stopped job's adoption 1
    step(store, 0)
    ckpt.control(headers.snapshot(number=1, clock=1, directory=str(tmp_path)))  # type: ignore[arg-type]
    settle(ckpt)

    fresh, loading, said = server()
    loading.control(headers.restore(directory=str(tmp_path), files=[file_name(0)]))  # type: ignore[arg-type]
    fresh.apply_map(map_header([0, 0], opt=SGD))
    loading.mapped()
    assert said.sent == [headers.restored(chunks=2)]
    fresh.init(init, [as_bytes(torch.full((4,), 5.0))], 0, 1)  # the resumed job's adoption 1
    assert fresh.chunks[0].value.tolist() == [5.0] * 4
    with pytest.raises(ProtocolError, match="not newer"):  # a replay of it
        fresh.init(init, [as_bytes(torch.full((4,), 9.0))], 0, 1)
    assert fresh.chunks[0].value.tolist() == [5.0] * 4
