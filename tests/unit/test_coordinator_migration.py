"""The coordinator's map and migration protocol as pure operations: placement, the
release of the first map, migrate / ack / handed, publishing, and a drain driven by the
rebalancer from SCALE to SHUTDOWN, all without threads or sockets."""

from __future__ import annotations

from typing import Any

import pytest

from trimtab.core.chunks import PlacementMap
from trimtab.errors import ProtocolError, UsageError
from trimtab.policies.placement import PLACEMENTS
from trimtab.policies.psld import SpeedEstimator
from trimtab.policies.scaling import SCALING
from trimtab.protocol.messages import Control
from trimtab.roles.coordinator import migration
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members, MemberState
from trimtab.roles.coordinator.outbox import Outbox, Refuse, Send
from trimtab.roles.coordinator.rebalance import Rebalancer

TENSORS = [["w", [64], "float32", 0], ["b", [16], "float32", 0]]  # 256 + 64 bytes
TERMS = {"batching": "equal", "consistency": "bsp"}


def register(members: Members) -> None:
    for s in range(members.num_servers):
        addr = f"tcp://s{s}"
        members.register(
            b"s%d" % s, {"o": 1, "i": 1, "role": "server", "addr": addr}, running=False
        )
    for w in range(members.num_workers):
        members.register(b"w%d" % w, {"o": 1, "i": 1, "role": "worker", "rank": w}, running=False)


def declare(maps: Maps, members: Members, rank: int, tensors: list[Any] = TENSORS) -> Outbox:
    header = {"o": int(Control.DECLARE), "i": 10 + rank, "tensors": tensors, "opt": {"lr": 1}}
    maps.declare(members.workers[rank], header)
    return maps.place(members)


def placed(workers: int = 2, servers: int = 2, max_servers: int = 0) -> tuple[Members, Maps]:
    """A job whose first map every server acknowledged and every worker received."""
    members = Members(workers, servers, max_servers or servers)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    for w in range(workers):
        declare(maps, members, w)
    for s in range(servers):
        maps.ack(s, members)
    return members, maps


def ops(out: Outbox) -> list[tuple[bytes, int]]:
    return [(m.peer, m.header["o"]) for m in out if isinstance(m, Send)]


def test_servers_get_the_first_map_and_workers_get_it_once_every_server_holds_it() -> None:
    members = Members(2, 2, 2)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    assert declare(maps, members, 0) == []  # waits for worker 1
    out = declare(maps, members, 1)
    assert ops(out) == [(b"s0", Control.MAP), (b"s1", Control.MAP)]
    header = out[0].header
    assert list(header)[:9] == [
        "o",
        "epoch",
        "tensors",
        "chunk_bytes",
        "owners",
        "servers",
        "opt",
        "workers",
        "batching",
    ]  # wire order: the placement's fields, then the job's terms
    assert header["owners"] == [0, 1, 0] and header["servers"] == ["tcp://s0", "tcp://s1"]
    assert maps.sizes == [128, 128, 64]
    assert all(m.state is MemberState.ACTIVE for m in members.servers)
    assert maps.ack(0, members) == []
    released = maps.ack(1, members)
    assert [(m.peer, m.header["i"]) for m in released] == [(b"w0", 10), (b"w1", 11)]
    assert all(w.floor == 1 for w in members.workers.values())


def test_workers_declaring_different_tensors_are_all_refused() -> None:
    members = Members(2, 1, 1)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    declare(maps, members, 0)
    out = declare(maps, members, 1, TENSORS[:1])
    assert [(m.peer, m.rid, m.code) for m in out if isinstance(m, Refuse)] == [
        (b"w0", 10, "mismatch"),
        (b"w1", 11, "mismatch"),
    ]
    assert "worker 1 declared different tensors than worker 0" in out[0].msg
    assert maps.map is None and ops(declare(maps, members, 0)) == []  # they declare again


def test_migrate_ack_and_handed_as_pure_operations() -> None:
    members, maps = placed()
    assert maps.map is not None and maps.header is not None
    with pytest.raises(UsageError, match="no placement yet"):
        migration.start(None, None, None, (0, 0, 0), members.servers)
    with pytest.raises(UsageError, match="a live server for every chunk"):
        migration.start(None, maps.map, maps.header, (0, 2, 0), members.servers)
    mig, out = migration.start(None, maps.map, maps.header, (1, 0, 0), members.servers)
    assert (mig.epoch, mig.owners, mig.moving, mig.acks) == (2, (1, 0, 0), {0, 1}, {0, 1})
    assert ops(out) == [(b"s0", Control.MIGRATE), (b"s1", Control.MIGRATE)]
    assert out[0].header["owners"] == [1, 0, 0] and out[0].header["tensors"] == TENSORS
    with pytest.raises(UsageError, match="epoch 2 still in flight"):
        migration.start(mig, maps.map, maps.header, (0, 0, 0), members.servers)

    with pytest.raises(ProtocolError, match="no such migration"):
        migration.ack(mig, 0, {"o": 19, "epoch": 3, "cuts": {}})
    with pytest.raises(ProtocolError, match="bad cuts") as bad:
        migration.ack(mig, 0, {"o": 19, "epoch": 2, "cuts": {"x": 1}})
    assert bad.value.args[0] == "malformed"
    mig = migration.ack(mig, 0, {"o": 19, "epoch": 2, "cuts": {"0": 4}})
    assert not mig.acked and mig.cuts == {0: 4}
    mig, moved = migration.handed(mig, {"o": 20, "c": [0, 0, 2]}, maps.sizes)
    assert moved == 128 and mig.moving == {1} and not mig.done  # chunk 2 was not moving
    mig = migration.ack(mig, 1, {"o": 19, "epoch": 2, "cuts": {"1": 5}})
    assert mig.acked and not mig.done
    mig, moved = migration.handed(mig, {"o": 20, "c": [1]}, maps.sizes)
    assert moved == 128 and mig.done
    with pytest.raises(ProtocolError, match="no migration in flight"):
        migration.handed(None, {"o": 20, "c": [1]}, maps.sizes)


def test_a_map_request_waits_for_the_published_map() -> None:
    _, maps = placed()
    assert ops(maps.want(b"w0", 7, 1)) == [(b"w0", Control.MAP)]  # the first map: now
    assert maps.want(b"w1", 8, 2) == []
    out = maps.publish(2, (1, 0, 1), ["tcp://s0", "tcp://s1"], {0: 4, 1: 5})
    assert maps.map == PlacementMap(2, (1, 0, 1), ("tcp://s0", "tcp://s1"))
    assert out == [
        Send(
            b"w1",
            {
                "o": int(Control.MAP),
                "i": 8,
                "epoch": 2,
                "owners": [1, 0, 1],
                "servers": ["tcp://s0", "tcp://s1"],
                "prev": [0, 1, 0],
                "cuts": {"0": 4, "1": 5},
            },
        )
    ]
    assert maps.waiting() == 0 and maps.published_epoch == 2


def rebalancer(members: Members, maps: Maps, **kwargs: Any) -> Rebalancer:
    return Rebalancer(
        members,
        maps,
        SpeedEstimator(),
        None,
        SCALING.create("stragglers"),
        rotate_every=kwargs.pop("rotate_every", 0),
        synchronous=kwargs.pop("synchronous", True),
        mode=kwargs.pop("mode", "bsp"),
        job_clock=lambda: 0,
    )


def test_scaling_in_drains_a_server_then_retires_it_once_no_request_can_reach_it() -> None:
    members, maps = placed()
    reb = rebalancer(members, maps)
    out: Outbox = []
    assert reb.scale(1, out) == 1
    assert ops(out) == [(b"s0", Control.MIGRATE), (b"s1", Control.MIGRATE)]
    assert reb.migrating is not None and reb.migrating.owners == (0, 0, 0)
    out = []
    maps.want(b"w0", 5, 2)
    reb.on_ack(1, {"o": 19, "epoch": 2, "cuts": {"1": 1}}, out)
    assert out == []  # server 0 has not acknowledged yet
    reb.on_ack(0, {"o": 19, "epoch": 2, "cuts": {}}, out)
    # The MAP_GET waiting is answered, and every worker is sent the map unasked.
    news = [(b"w0", Control.MAP_NEWS), (b"w1", Control.MAP_NEWS)]
    assert ops(out) == [(b"w0", Control.MAP), *news] and maps.epoch == 2
    assert out[1].header == {**out[0].header, "o": Control.MAP_NEWS, "i": 0}
    out = []
    reb.on_handed({"o": 20, "c": [1, 2]}, out)  # chunk 2 was not moving
    assert reb.migrating is None and reb.migrations == 1 and reb.bytes_moved == 128
    # Both workers' floors are still at map 1: server 1 waits, empty.
    assert out == [] and members.servers[1].state is MemberState.EMPTY
    members.raise_floor(members.workers[0], 2)
    members.raise_floor(members.workers[1], 2)
    reb.retire(out)
    assert ops(out) == [(b"s1", Control.SHUTDOWN)]


def test_a_forced_rotation_moves_every_chunk_to_the_next_server() -> None:
    members, maps = placed()
    reb = rebalancer(members, maps, rotate_every=1)
    out: Outbox = []
    reb.step_boundary(1, out)
    assert reb.migrating is not None and reb.migrating.owners == (1, 0, 1)
    reb.step_boundary(2, out)  # one migration at a time
    assert ops(out) == [(b"s0", Control.MIGRATE), (b"s1", Control.MIGRATE)]


def test_an_asynchronous_job_cannot_scale() -> None:
    members, maps = placed()
    with pytest.raises(ProtocolError, match="runs --mode asp, so it cannot scale"):
        rebalancer(members, maps, synchronous=False, mode="asp").scale(1, [])


def test_a_drained_server_is_not_retired_while_its_chunks_are_still_being_handed_over() -> None:
    """The map that empties a draining server is published once every server acknowledged
    it, before its chunks reach their new owners. Workers' floors may pass that map
    first (they route by it at once): retiring the server then took its chunks in
    flight and their HANDED with it, and the migration never finished (no later one
    started either; the 60 s stall of the scaling equivalence test)."""
    members, maps = placed()
    reb = rebalancer(members, maps)
    out: Outbox = []
    reb.scale(1, out)
    out = []
    reb.on_ack(1, {"o": 19, "epoch": 2, "cuts": {"1": 1}}, out)
    reb.on_ack(0, {"o": 19, "epoch": 2, "cuts": {}}, out)
    assert maps.epoch == 2 and reb.migrating is not None and reb.migrating.moving
    out = []
    members.raise_floor(members.workers[0], 2)
    members.raise_floor(members.workers[1], 2)
    reb.retire(out)  # (a floor rose) chunk 1 is still on its way from server 1
    assert out == [] and members.servers[1].state is not MemberState.RETIRED
    reb.on_handed({"o": 20, "c": [1]}, out)
    assert reb.migrating is None
    assert ops(out) == [(b"s1", Control.SHUTDOWN)]


def test_a_late_ack_of_the_map_that_stands_is_moot_any_other_is_refused() -> None:
    # A replacement coordinator rebuilt the job from the servers' map (epoch 1 here)
    # while a role move's MIGRATE_ACK waited on a server for its backups to hold their
    # chunks: it arrives with nothing in flight. Refusing it ended the job in CI (the
    # server aborted: "coordinator refused us: no such migration in flight").
    members, maps = placed()
    reb = rebalancer(members, maps)
    out: Outbox = []
    reb.on_ack(1, {"o": 19, "epoch": 1, "cuts": {}}, out)
    assert out == [] and reb.migrating is None and maps.epoch == 1
    with pytest.raises(ProtocolError, match="no such migration"):
        reb.on_ack(1, {"o": 19, "epoch": 2, "cuts": {}}, out)  # a map nobody sent
