"""Chunks changing hands between two servers' stores, with no transport: the lifecycle
(OWNED -> LEAVING -> HANDED -> gone at the old owner, ARRIVING -> OWNED at the new one)
and the HANDOVER that carries value, version, round and optimizer state."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.unit.test_server_store import map_header, push, store_of
from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.roles.server.handover import Handover
from trimtab.roles.server.lifecycle import TRANSITIONS, ChunkPhase, Move, check_transition
from trimtab.runtime.credentials import SERVER, Credentials, credential, new_key
from trimtab.runtime.tensors import as_bytes


def migrate(owners: list[int]) -> dict[str, Any]:
    return {**map_header(owners), "epoch": 2}


def servers(**opt: Any) -> tuple[Handover, Handover]:
    """Server 0 owning chunks 0 and 1 (server 1 owns none yet), momentum SGD."""
    header = map_header([0, 0], mode="server")
    header["opt"]["groups"] = [{"lr": 0.5, "momentum": 0.9, **opt}]
    old, new = store_of(index=0), store_of(index=1)
    old.apply_map(header)
    new.apply_map(header)
    key = new_key()
    handovers = []
    for store in (old, new):
        creds = Credentials("job")
        creds.learn(key, 2, credential(key, "job", SERVER, store.index))
        handovers.append(Handover(store, creds))
    return handovers[0], handovers[1]


def test_every_phase_has_its_legal_next_phases_and_nothing_else() -> None:
    assert TRANSITIONS[ChunkPhase.LEAVING] == {ChunkPhase.HANDED}
    check_transition(3, ChunkPhase.ARRIVING, ChunkPhase.OWNED)
    for was, to in [
        (ChunkPhase.OWNED, ChunkPhase.HANDED),  # must leave first
        (ChunkPhase.HANDED, ChunkPhase.OWNED),
        (None, ChunkPhase.LEAVING),
    ]:
        with pytest.raises(ProtocolError, match="cannot go from"):
            check_transition(3, was, to)
    move = Move(3, ChunkPhase.ARRIVING)
    with pytest.raises(ProtocolError, match="from arriving to handed"):
        move.to(ChunkPhase.HANDED)


def test_a_chunk_leaves_after_its_cut_with_value_version_round_and_optimizer_state() -> None:
    old, new = servers()
    push(old.store, 0, [1, 1, 1, 1], chunk=0)  # round 0 in progress: the cut is 1
    target = migrate([1, 0])
    assert old.plan(target) == {"0": 1}
    assert new.plan(target) == {} and new.is_arriving(0) and new.arriving() == 1
    assert old.ready(0) is None  # round 0 still waits for worker 1
    assert old.moves[0].phase is ChunkPhase.LEAVING
    push(old.store, 1, [3, 3, 3, 3], chunk=0)  # completes round 0: now it may go
    assert new.queue(0, b"early-worker", [memoryview(b"x")])
    message = old.ready(0)
    assert message is not None
    address, header, frames = message
    assert address == "inproc://s1" and old.moves[0].phase is ChunkPhase.HANDED
    assert 0 not in old.store.chunks
    assert old.handed(header["i"], b"") is None  # the server loop sets where it went
    old.moves[0].peer = b"o:inproc://s1"
    assert old.handed(header["i"], b"i:someone-else") is None  # only that peer's ACK counts
    assert old.handed(header["i"], b"o:inproc://s1") == 0
    assert new.credentials.server(dict(header)) == 0  # the old owner's credential
    with pytest.raises(ProtocolError, match="comes from server 0, not server 1"):
        new.arrive(header, [memoryview(bytes(f)) for f in frames], sender=1)
    queued = new.arrive(header, [memoryview(bytes(f)) for f in frames], sender=0)
    assert queued == [(b"early-worker", [memoryview(b"x")])]
    got = new.store.chunks[0]
    assert (got.version, got.round) == (1, 1) and 0 not in new.moves
    assert got.value.tolist() == [-1.0] * 4  # 0 - 0.5 * mean(1, 3)
    assert got.optimizer is not None
    buf = got.optimizer.optimizer.state[got.optimizer.param]["momentum_buffer"]
    assert torch.equal(buf, torch.full((4,), 2.0))  # the first step's buffer: the gradient
    assert got.optimizer.optimizer.param_groups[0]["momentum"] == 0.9
    old.acked(0)
    assert 0 not in old.moves and old.moved_out == 1 and new.moved_in == 1


def test_a_handover_nobody_expects_is_refused() -> None:
    old, new = servers()
    old.plan(migrate([1, 0]))
    message = old.ready(0)
    assert message is not None
    with pytest.raises(ProtocolError, match="does not expect it"):
        new.arrive(message[1], [memoryview(bytes(f)) for f in message[2]], sender=0)


def test_between_servers_of_one_machine_the_bytes_go_through_shared_memory() -> None:
    """A HANDOVER to a server on this machine carries only its header (the value and the
    optimizer state are in the old owner's arena); the new owner copies them out, so
    the arena may be reused once it acknowledged."""
    old, new = servers()
    try:
        push(old.store, 0, [1, 1, 1, 1], chunk=0)
        push(old.store, 1, [3, 3, 3, 3], chunk=0)
        old.plan(migrate([1, 0]))
        new.plan(migrate([1, 0]))
        old.store.servers = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
        message = old.ready(0)
        assert message is not None
        _, header, frames = message
        assert frames == [] and header["sm"][2] == 4 * 4 * 2  # value and momentum, fp32
        new.arrive(header, [], sender=0)
        got = new.store.chunks[0]
        assert got.value.tolist() == [-1.0] * 4 and (got.version, got.round) == (1, 1)
        assert got.optimizer is not None
        buf = got.optimizer.optimizer.state[got.optimizer.param]["momentum_buffer"]
        assert torch.equal(buf, torch.full((4,), 2.0))
        header["sm"][0] = header["sm"][0].replace("s0-", "s1-")  # not the sender's arena
        with pytest.raises(ProtocolError, match="arena"):
            Handover(new.store, new.credentials).arenas.read(header, header["sm"], [])
    finally:
        old.arenas.close()
        new.arenas.close()


def test_a_moved_chunk_keeps_refusing_an_adoption_it_took_before_the_move() -> None:
    """A chunk's last adoption travels with it: its new owner refuses a replay of an
    INIT of that adoption (or an older one), as the old owner would have, and takes the
    next."""
    old, new = servers()
    init = {**headers.init(chunk=0, epoch=1, dtype="float32", numel=4), "i": 1}
    old.store.init(init, [as_bytes(torch.full((4,), 3.0))], 0, 2)  # adoption 2
    target = migrate([1, 0])
    old.plan(target)
    new.plan(target)
    message = old.ready(0)
    assert message is not None and message[1]["ad"] == 2
    new.arrive(message[1], [memoryview(bytes(f)) for f in message[2]], sender=0)
    for replayed in (1, 2):
        with pytest.raises(ProtocolError, match="not newer than its last"):
            new.store.init(init, [as_bytes(torch.full((4,), 9.0))], 0, replayed)
    assert new.store.chunks[0].value.tolist() == [3.0] * 4
    new.store.init(init, [as_bytes(torch.full((4,), 5.0))], 0, 3)
    assert new.store.chunks[0].value.tolist() == [5.0] * 4
