"""Server replicas without sockets: where backups go (never with their chunk), a
primary's REPLICATE taken by its backup, a failover promoting the copy, a resent push
of an applied round recognised, a stale-epoch write refused, and the coordinator's
answer to a lost server with and without replicas."""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_server_store import map_header, push
from trimtab.errors import ProtocolError
from trimtab.policies import replicas as policy
from trimtab.policies.placement import PLACEMENTS
from trimtab.protocol import replica
from trimtab.protocol.messages import Control, Data, ErrorCode, decode, encode
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members, MemberState
from trimtab.roles.coordinator.outbox import Send
from trimtab.roles.coordinator.recovery import Recovery
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.replica import Replicas
from trimtab.roles.server.replica_link import ReplicaLink
from trimtab.roles.server.slots import SharedArenas
from trimtab.roles.server.store import ChunkStore
from trimtab.runtime.credentials import Credentials
from trimtab.runtime.loop import NodeLoop

# -- where backups go ----------------------------------------------------------------


@given(
    servers=st.integers(2, 6),
    data=st.data(),
)
def test_a_backup_is_never_on_its_chunk_s_server(servers: int, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    owners = data.draw(st.lists(st.integers(0, servers - 1), min_size=n, max_size=n))
    sizes = data.draw(st.lists(st.integers(1, 1 << 20), min_size=n, max_size=n))
    backups = policy.backups(owners, sizes, range(servers))
    assert all(b != o and 0 <= b < servers for o, b in zip(owners, backups, strict=True))
    dead = data.draw(st.integers(0, servers - 1))
    live = [s for s in range(servers) if s != dead]
    new_owners, new_backups, lost = policy.failover(owners, backups, sizes, dead, live)
    assert lost == []  # one death never takes a chunk and its backup
    for cid, (o, b) in enumerate(zip(new_owners, new_backups, strict=True)):
        assert o != dead and o in live
        if owners[cid] != dead:
            assert o == owners[cid]  # only the dead server's chunks move
        else:
            assert o == backups[cid]  # ... to their backups, which hold them
        assert b != o and (b in live or (b == policy.NONE and len(live) == 1))


@pytest.mark.parametrize("name", ["hash", "mxnet", "greedy", "psld"])
def test_no_placement_policy_s_map_co_locates_a_chunk_and_its_backup(name: str) -> None:
    from trimtab.core.chunks import TensorSpec, make_chunks

    tensors = [TensorSpec(f"t{i}", (100 * (i + 1),), "float32", 0) for i in range(12)]
    chunks = make_chunks(tensors, 512)
    for servers in (2, 3, 5):
        owners = PLACEMENTS.create(name).place(tensors, chunks, servers)
        backups = policy.backups(owners, [c.nbytes for c in chunks], range(servers))
        assert all(o != b for o, b in zip(owners, backups, strict=True)), name


def test_backups_balance_bytes_and_keep_what_is_still_valid() -> None:
    backups = policy.backups([0, 0, 0, 0], [4, 4, 4, 4], range(3))
    assert sorted(backups) == [1, 1, 2, 2]
    assert policy.backups([0, 1], [4, 4], range(3), keep=[2, 0]) == [2, 0]
    assert policy.backups([0, 1], [4, 4], range(3), keep=[0, 1])[0] != 0  # invalid: redone


# -- a primary and its backup ----------------------------------------------------------

KEY = b"k" * 32


def server(index: int, owners: list[int], backups: list[int], **more: Any) -> Replicas:
    store = ChunkStore(LoadMeter(), SharedArenas("job"))
    store.index = index
    store.apply_map(map_header(owners, mode="server", bk=backups, **more))  # type: ignore[arg-type]
    creds = Credentials("job")
    from trimtab.runtime.credentials import credential

    creds.learn(KEY, 2, credential(KEY, "job", "server", index))
    replicas = Replicas(store, creds)
    replicas.learn(map_header(owners, mode="server", bk=backups))  # type: ignore[arg-type]
    return replicas


def wire(header: Any, frames: list[Any]) -> tuple[dict[str, Any], list[memoryview]]:
    """What the receiver decodes: the header through msgpack, the frames as views."""
    header["j"] = "job"
    return decode(encode(header), "job"), [memoryview(bytes(f)) for f in frames]


def test_a_backup_holds_the_round_its_primary_applied_and_takes_over_on_failover() -> None:
    primary, backup = server(0, [0, 1], [1, 0]), server(1, [0, 1], [1, 0])
    primary.store.chunks[0].adopted = 2  # a broadcast_parameters' INIT set it
    push(primary.store, 0, [1, 2, 3, 4])
    replies = push(primary.store, 1, [3, 2, 1, 0])
    assert len(replies) == 2  # round 0 complete: to be released once replicated
    released: list[str] = []
    message = primary.replicate(0, [lambda: released.append("values")], [])
    assert message is not None
    address, header, frames = message
    assert address == "inproc://s1"
    assert released == []  # nothing leaves before the backup holds it
    got, views = wire(header, frames)
    backup.take(got, views, sender=0)
    primary.sent(header["i"], b"backup")
    assert primary.acked(header["i"], b"someone else") is None  # only its ACK settles it
    for release in primary.acked(header["i"], b"backup") or []:
        release()
    assert released == ["values"] and not primary.in_flight
    copy = backup.copies[0]
    chunk = primary.store.chunks[0]
    assert torch.equal(copy.value, chunk.value)
    assert (copy.version, copy.round, copy.last_clock) == (1, 1, {0: 0, 1: 0})
    assert copy.adopted == 2  # promoted, it refuses a replay of that adoption's INIT
    assert copy.optimizer is not None and chunk.optimizer is not None
    # The failover: server 0 is dead, its chunk 0 goes to its backup, server 1.
    failover = replica.failover(epoch=2, dead=0, owners=[1, 1], backups=[-1, -1], servers=[])
    got_failover, _ = wire(failover, [])
    changed, _ = backup.failover(replica.read_failover(got_failover))
    assert backup.store.chunks[0] is copy and backup.fence == 2 and backup.store.epoch == 2
    assert sorted(changed) == [0, 1]  # both lost their backup (no other server is live)
    # A worker resends its push of clock 0, answered already by no one: applied once.
    assert backup.applied(copy, 0) and not backup.applied(copy, 1)
    push(backup.store, 0, [1, 1, 1, 1], clock=1)
    assert push(backup.store, 1, [1, 1, 1, 1], clock=1)  # round 1 goes on at the backup
    assert backup.store.chunks[0].version == 2


def test_through_shared_memory_a_promoted_backup_reads_the_round_it_acknowledged() -> None:
    """One copy a round: the backup keeps the primary's arena, not a copy of it. The
    primary's two arenas take turns, so a round written but not yet acknowledged never
    overwrites the one the backup holds: promoted, it reads that round (value and
    momentum), however far the primary got since."""
    momentum = {"opt": {"mode": "server", "cls": "SGD", "groups": [{"lr": 0.5, "momentum": 0.9}]}}
    primary = server(0, [0, 1], [1, 0], **momentum)
    backup = server(1, [0, 1], [1, 0], **momentum)
    local = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    primary.store.servers = backup.store.servers = local
    names: list[str] = []
    try:
        for clock in range(4):
            push(primary.store, 0, [1, 2, 3, 4], clock=clock)
            push(primary.store, 1, [3, 2, 1, float(clock)], clock=clock)
            message = primary.replicate(0, [], [])
            assert message is not None and message[2] == []  # only the header travels
            header = message[1]
            names.append(header["sm"][0])
            if clock == 3:
                break  # written, never acknowledged: the primary dies with it in flight
            backup.take(*wire(header, []), sender=0)
            primary.sent(header["i"], b"backup")
            assert primary.acked(header["i"], b"backup") == []
            chunk = primary.store.chunks[0]
            assert chunk.optimizer is not None
            opt = chunk.optimizer
            held = chunk.value.clone(), opt.optimizer.state[opt.param]["momentum_buffer"].clone()
        assert names[0] == names[2] != names[1] == names[3]  # two arenas take turns
        assert not torch.equal(primary.store.chunks[0].value, held[0])  # it went on
        failover = replica.failover(epoch=2, dead=0, owners=[1, 1], backups=[-1, -1], servers=[])
        backup.failover(replica.read_failover(wire(failover, [])[0]))
        promoted = backup.store.chunks[0]
        assert promoted.optimizer is not None
        assert torch.equal(promoted.value, held[0])
        state = promoted.optimizer.optimizer.state[promoted.optimizer.param]
        assert torch.equal(state["momentum_buffer"], held[1])
        assert promoted.round == 3  # the round of the last acknowledged REPLICATE
        # A replication taken off unacknowledged (a new backup): new arenas, since the
        # old backup may hold either one.
        primary.resync(0)
        message = primary.replicate(0, [], [])
        assert message is not None and message[1]["sm"][0] not in names
    finally:
        primary.arenas.close()
        backup.arenas.close()


def test_a_copy_a_new_map_takes_away_is_kept_until_the_next_map_and_can_be_promoted() -> None:
    """Server 1 backs up chunk 0 for server 0, then a MIGRATE gives chunk 0's backup to
    server 2: server 1 keeps its copy (retired) and says so in its holdings. Server 0
    dies before server 2 holds anything: the failover gives chunk 0 to server 1, which
    promotes the retired copy. The map after that drops what is retired."""
    primary, backup = server(0, [0, 1], [1, 0]), server(1, [0, 1], [1, 0])
    push(primary.store, 0, [1, 2, 3, 4])
    push(primary.store, 1, [3, 2, 1, 0])
    message = primary.replicate(0, [], [])
    assert message is not None
    backup.take(*wire(message[1], message[2]), sender=0)
    value = primary.store.chunks[0].value.clone()
    servers = ("inproc://s0", "inproc://s1", "inproc://s2")
    backup.remap((0, 1), [2, 0], servers, epoch=2)  # chunk 0's backup moves to server 2
    assert 0 not in backup.copies and 0 in backup.retired
    assert backup.holdings() == {0: 1, 1: 0}
    lost = replica.failover(epoch=3, dead=0, owners=[1, 1], backups=[2, 2], servers=[*servers])
    backup.failover(replica.read_failover(wire(lost, [])[0]))
    assert torch.equal(backup.store.chunks[0].value, value) and backup.store.chunks[0].round == 1
    assert not backup.retired
    backup.remap((1, 1), [2, 2], servers, epoch=4)
    assert not backup.retired and not backup.copies


def test_a_write_of_a_stale_epoch_from_a_fenced_off_primary_is_refused() -> None:
    old_primary, backup = server(0, [0, 1], [1, 0]), server(1, [0, 1], [1, 0])
    first = old_primary.replicate(0, [], [])
    assert first is not None
    backup.take(*wire(first[1], first[2]), sender=0)
    failover = replica.failover(epoch=2, dead=0, owners=[1, 1], backups=[-1, -1], servers=[])
    backup.failover(replica.read_failover(wire(failover, [])[0]))
    message = old_primary.replicate(0, [], [])  # it was only slow: it still thinks it owns 0
    assert message is not None
    got, views = wire(message[1], message[2])
    before = backup.store.chunks[0].value.clone()
    with pytest.raises(ProtocolError) as refused:
        backup.take(got, views, sender=0)
    assert refused.value.args[0] == ErrorCode.STALE_EPOCH.value
    assert torch.equal(backup.store.chunks[0].value, before)  # nothing changed


def test_only_the_chunk_s_owner_may_write_its_backup() -> None:
    a, b = server(0, [0, 1], [1, 0]), server(1, [0, 1], [1, 0])
    message = a.replicate(0, [], [])
    assert message is not None
    got, views = wire(message[1], message[2])
    with pytest.raises(ProtocolError) as refused:
        b.take(got, views, sender=2)
    assert refused.value.args[0] == ErrorCode.FORBIDDEN.value
    assert 0 not in b.copies


def test_a_malformed_replicate_is_refused_before_anything_changes() -> None:
    a, b = server(0, [0, 1], [1, 0]), server(1, [0, 1], [1, 0])
    message = a.replicate(0, [], [])
    assert message is not None
    got, views = wire(message[1], message[2])
    got["lc"] = [[0, "x"]]
    with pytest.raises(ProtocolError, match="lc"):
        b.take(got, views, sender=0)
    got, views = wire(message[1], message[2])
    with pytest.raises(ProtocolError):
        b.take(got, [*views[:1], memoryview(b"extra")], sender=0)  # a frame too many
    got, views = wire(message[1], message[2])
    with pytest.raises(ProtocolError):
        b.take(got, [memoryview(b"short")], sender=0)  # a value of the wrong size
    assert 0 not in b.copies


# -- the coordinator -------------------------------------------------------------------


def coordinator(replicas: int) -> tuple[Members, Maps, Recovery]:
    members = Members(num_workers=1, num_servers=3, max_servers=3)
    for i in range(3):
        members.register(
            f"s{i}".encode(),
            {"o": int(Control.REGISTER), "role": "server", "addr": f"tcp://s{i}"},
            running=False,
        )
    members.register(
        b"w0", {"o": int(Control.REGISTER), "role": "worker", "rank": 0}, running=False
    )
    maps = Maps(PLACEMENTS.create("greedy"), 16, {})
    recovery = Recovery(members, maps, replicas)
    opt = {"mode": "server", "cls": "SGD", "groups": [{"lr": 0.1}]}
    maps.declare(
        members.workers[0], {"o": 4, "i": 1, "tensors": [["w", [24], "float32", 0]], "opt": opt}
    )
    out = maps.place(members)
    assert out
    return members, maps, recovery


def test_without_replicas_a_lost_server_ends_the_job_naming_its_chunks() -> None:
    members, maps, recovery = coordinator(0)
    assert maps.map is not None
    owned = [c for c, o in enumerate(maps.map.owners) if o == 1]
    out: list[Any] = []
    why = recovery.member_lost(members.servers[1], "has been silent for 3s", out)
    assert why is not None and "had no replica and are lost" in why
    assert str(owned[0]) in why and "--replicas 1" in why
    assert out == []


def test_with_replicas_a_lost_server_s_chunks_go_to_their_backups_under_a_new_epoch() -> None:
    members, maps, recovery = coordinator(1)
    assert maps.map is not None and maps.backups
    owners = maps.map.owners
    out: list[Any] = []
    assert recovery.member_lost(members.servers[1], "has been silent for 3s", out) is None
    assert members.servers[1].state is MemberState.LOST
    to_servers = [m for m in out if isinstance(m, Send) and m.peer in (b"s0", b"s2")]
    assert len(to_servers) == 2
    failover = to_servers[0].header
    assert failover["e"] == 2 and 1 not in failover["owners"]
    for cid, owner in enumerate(owners):
        if owner == 1:
            assert failover["owners"][cid] == maps.backups[cid] or failover["bk"][cid] != 1
    assert all(b not in (1, o) for o, b in zip(failover["owners"], failover["bk"], strict=True))
    notice = [m for m in out if isinstance(m, Send) and m.peer == b"w0"]
    assert notice and notice[0].header["dead"] == "tcp://s1"
    # Published once both live servers took it; a worker waiting for epoch 2 is answered.
    assert maps.want(b"w0", 9, 2) == []
    more: list[Any] = []
    recovery.on_ack(members.servers[0], {"e": 2}, [], more)
    assert more == []
    recovery.on_ack(members.servers[2], {"e": 2}, [], more)
    assert maps.epoch == 2 and [m.header["epoch"] for m in more] == [2]
    with pytest.raises(ProtocolError):
        recovery.on_ack(members.servers[2], {"e": 2}, [], [])  # none in flight any more


def live_placement() -> tuple[Members, Maps, Any, Recovery]:
    """The coordinator of :func:`coordinator` with replicas and live placement, its map
    held, and a migration that moves every chunk's roles in flight (to epoch 2)."""
    from trimtab.policies.psld.speeds import SpeedEstimator
    from trimtab.policies.scaling import DEFAULT_SCALING, SCALING
    from trimtab.roles.coordinator.rebalance import Rebalancer

    members, maps, _ = coordinator(1)
    rebalancer = Rebalancer(
        members, maps, SpeedEstimator(), None, SCALING.create(DEFAULT_SCALING),
        rotate_every=0, synchronous=True, mode="bsp", job_clock=lambda: 0,
    )  # fmt: skip
    recovery = Recovery(members, maps, 1, rebalancer)
    for rank in range(3):
        maps.ack(rank, members)
    assert maps.map is not None and not maps.pending
    rebalancer.migrate([(o + 1) % 3 for o in maps.map.owners], [])
    assert rebalancer.migrating is not None and rebalancer.migrating.epoch == 2
    return members, maps, rebalancer, recovery


def held(epoch: int, rounds: dict[int, int]) -> dict[str, Any]:
    return dict(replica.held(epoch=epoch, rounds=rounds))


def test_a_server_lost_during_a_migration_is_failed_over_to_each_chunk_s_newest_copy() -> None:
    members, maps, rebalancer, recovery = live_placement()
    out: list[Any] = []
    assert recovery.member_lost(members.servers[0], "its connection closed", out) is None
    assert rebalancer.migrating is None  # given up: a late ack of it changes nothing
    rebalancer.on_ack(1, {"o": int(Control.MIGRATE_ACK), "epoch": 2, "cuts": {}}, [])
    assert [(m.peer, m.header["e"]) for m in out] == [(b"s1", 3), (b"s2", 3)]  # HOLDINGS
    n = len(maps.sizes)
    # Server 1 holds every chunk, server 2 only the even ones, but a round newer.
    assert recovery.on_held(members.servers[1], held(3, dict.fromkeys(range(n), 4)), []) is None
    with pytest.raises(ProtocolError):  # one answer each
        recovery.on_held(members.servers[1], held(3, {}), [])
    failed: list[Any] = []
    newer = {c: 5 for c in range(0, n, 2)}
    assert recovery.on_held(members.servers[2], held(3, newer), failed) is None
    failover = next(m.header for m in failed if m.peer == b"s1")
    assert failover["e"] == 3 and failover["dead"] == 0
    assert failover["owners"] == [2 if c % 2 == 0 else 1 for c in range(n)]
    assert all(b not in (0, o) for o, b in zip(failover["owners"], failover["bk"], strict=True))
    assert [m.header["dead"] for m in failed if m.peer == b"w0"] == ["tcp://s0"]


def test_a_chunk_no_live_server_holds_after_a_death_during_a_migration_ends_the_job() -> None:
    members, maps, _, recovery = live_placement()
    assert recovery.member_lost(members.servers[2], "has been silent for 3s", []) is None
    assert recovery.on_held(members.servers[0], held(3, {0: 1}), []) is None
    why = recovery.on_held(members.servers[1], held(3, {}), [])
    assert why is not None and f"no live server holds chunks 1-{len(maps.sizes) - 1}" in why
    with pytest.raises(ProtocolError, match="bad pair"):
        replica.read_held({"e": 3, "h": [[0, -1]]}, 4)


# -- the server loop's side: what ReplicaLink sends ------------------------------------


class _Loop:
    """A NodeLoop's send and refuse, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, dict[str, Any]]] = []
        self.refused: list[tuple[Any, str]] = []

    def send(self, peer: Any, header: Any, frames: Any = ()) -> None:
        self.sent.append((peer, dict(header)))

    def refuse(self, peer: Any, rid: int, code: str, msg: str, *, data: bool) -> None:
        self.refused.append((peer, code))


def link(replicas: Replicas) -> tuple[ReplicaLink, _Loop, list[Any], list[str]]:
    loop, values, stops = _Loop(), [], []
    made = ReplicaLink(
        replicas,
        cast(NodeLoop, loop),
        lambda address: address.encode(),
        b"coordinator",
        lambda peer, rid, chunk, k: values.append((peer, rid, chunk.spec.id, k)),
        stops.append,
    )
    return made, loop, values, stops


def test_replies_wait_for_the_backup_s_ack_and_a_refusal_stops_the_primary() -> None:
    primary, loop, _, stops = link(server(0, [0, 1], [1, 0]))
    released: list[int] = []
    primary.after(0, [lambda: released.append(0)], [])
    assert released == [] and loop.sent[0][0] == b"inproc://s1"
    rid = loop.sent[0][1]["i"]
    assert primary.answer(b"inproc://s1", int(Data.ACK), rid, {}) and released == [0]
    assert not primary.answer(b"inproc://s1", int(Data.ACK), rid, {})  # settled once
    primary.after(0, [lambda: released.append(1)], [])
    rid = loop.sent[1][1]["i"]
    refusal = {"code": ErrorCode.FORBIDDEN.value, "msg": "not yours"}
    assert primary.answer(b"inproc://s1", int(Data.ERROR), rid, refusal)
    assert released == [0] and stops and "not yours" in stops[0]


def test_a_stale_epoch_refusal_holds_the_replies_until_the_new_map_moves_them() -> None:
    """A backup that took a newer map refuses a REPLICATE of the old one: the primary
    neither stops nor releases; the MIGRATE moving the chunk away (on its way) answers
    the held replies *moved*, to be resent to the new owner."""
    primary, loop, _, stops = link(server(0, [0, 1], [1, 0]))
    released: list[int] = []
    primary.after(0, [lambda: released.append(0)], [(b"inproc://w0", 7)])
    rid = loop.sent[0][1]["i"]
    refusal = {"code": ErrorCode.STALE_EPOCH.value, "msg": "older map"}
    assert primary.answer(b"inproc://s1", int(Data.ERROR), rid, refusal)
    assert released == [] and stops == []
    store = primary.replicas.store
    changed, moved = primary.replicas.remap((1, 1), [0, 0], store.servers, 2)
    assert moved == [(b"inproc://w0", 7, 0)] and changed == []  # it owns nothing now
    assert 0 not in store.chunks and 0 in primary.replicas.copies  # now its backup


def test_without_a_backup_replies_go_at_once() -> None:
    alone, loop, _, _ = link(server(0, [0, 0], [-1, -1]))
    released: list[int] = []
    alone.after(1, [lambda: released.append(1)], [])
    assert released == [1] and loop.sent == []


def test_a_resent_push_of_an_applied_round_is_answered_not_applied() -> None:
    replicas = server(0, [0, 1], [1, 0])
    push(replicas.store, 0, [1, 1, 1, 1])
    push(replicas.store, 1, [1, 1, 1, 1])  # round 0 applied
    owner, _, values, _ = link(replicas)
    resent = {"o": int(Data.PUSH), "i": 7, "c": 0, "k": 0, "r": 1}
    assert not owner.resent(b"w1", resent, replicas.store.chunks)  # no failover: as ever
    replicas.fence = 2
    assert owner.resent(b"w1", resent, replicas.store.chunks)
    assert values == [(b"w1", 7, 0, 0)] and replicas.store.chunks[0].version == 1
    assert not owner.resent(b"w1", {**resent, "k": 1}, replicas.store.chunks)  # a new round


def test_a_replicate_of_a_failover_map_not_yet_taken_waits_for_it() -> None:
    # Chunk 1's owner, server 2, died; its backup, server 0, owns it now and replicates
    # it to its new backup, server 1, which has not taken the FAILOVER yet.
    owners, backups = [1, 2], [0, 0]
    new_owner = server(0, owners, backups)
    servers = ["inproc://s0", "inproc://s1", "inproc://s2"]
    failover = replica.failover(epoch=2, dead=2, owners=[1, 0], backups=[0, 1], servers=servers)
    got = replica.read_failover(wire(failover, [])[0])
    new_owner.failover(got)
    message = new_owner.replicate(1, [], [])
    assert message is not None
    backup, loop, _, _ = link(server(1, owners, backups))
    header, frames = wire(message[1], message[2])
    backup.take(b"s0", [memoryview(b""), *frames], header, sender=0)
    assert 1 not in backup.replicas.copies and loop.sent == []  # held
    backup.failover(wire(failover, [])[0])
    assert 1 in backup.replicas.copies  # taken once the failover map was
    assert [h["o"] for _, h in loop.sent] == [int(Control.FAILOVER_ACK), int(Data.ACK)]


def test_a_server_not_yet_given_the_job_learns_it_from_a_failover_and_backs_up() -> None:
    # Server 2 joined (the launcher's replacement for a lost server) and was given
    # nothing yet when server 1 died: the FAILOVER makes it chunk 1's backup, and carries
    # the job's tables (as the coordinator sends it), so it can take the REPLICATE.
    owners, backups = [0, 1], [1, 0]
    new_owner = server(0, owners, backups)
    servers = ["inproc://s0", "inproc://s1", "inproc://s2"]
    failover = replica.failover(epoch=2, dead=1, owners=[0, 0], backups=[2, 2], servers=servers)
    job = {**map_header(owners, mode="server", bk=backups), **failover, "epoch": 2}
    new_owner.failover(replica.read_failover(wire(dict(failover), [])[0]))
    message = new_owner.replicate(1, [], [])
    assert message is not None
    store = ChunkStore(LoadMeter(), SharedArenas("job"))
    store.index = 2
    creds = Credentials("job")
    creds.learn(KEY, 2, None)
    joined, loop, _, _ = link(Replicas(store, creds))
    joined.failover(wire(job, [])[0])
    assert len(store.specs) == 2 and joined.replicas.backup_of == [2, 2]
    header, frames = wire(message[1], message[2])
    joined.take(b"s0", [memoryview(b""), *frames], header, sender=0)
    assert 1 in joined.replicas.copies
    assert [h["o"] for _, h in loop.sent] == [int(Control.FAILOVER_ACK), int(Data.ACK)]


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(["c", "v", "k", "e", "s", "dt", "n", "p", "ls", "lc", "hp", "st", "sm"]),
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-3, 300) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=8,
    ),
    extra=st.lists(st.binary(max_size=40), max_size=2),
)
def test_any_replicate_is_taken_or_refused_never_a_crash(
    key: str, value: Any, extra: list[bytes]
) -> None:
    a, b = server(0, [0, 1], [1, 0]), server(1, [0, 1], [1, 0])
    message = a.replicate(0, [], [])
    assert message is not None
    header, views = wire(message[1], message[2])
    header[key] = value
    try:
        b.take(header, [*views, *map(memoryview, extra)], sender=0)
    except ProtocolError:
        assert 0 not in b.copies  # refused: nothing taken


def test_replicas_need_bsp_and_two_servers() -> None:
    from trimtab.errors import ConfigError
    from trimtab.settings import (
        ConsistencySettings,
        ElasticSettings,
        JobSettings,
        PlacementSettings,
    )

    one = ElasticSettings(replicas=1)
    assert JobSettings(workers=2, servers=2, elastic=one).elastic.replicas == 1
    for bad in (
        {"servers": 1, "elastic": one},
        {"servers": 2, "elastic": one, "consistency": ConsistencySettings("asp")},
    ):
        with pytest.raises(ConfigError):
            JobSettings(workers=2, **bad)  # type: ignore[arg-type]
    # Live placement moves roles in a job with replicas (role_moves): it is allowed.
    psld = JobSettings(workers=2, servers=2, elastic=one, placement=PlacementSettings("psld"))
    assert psld.migrates and psld.elastic.replicas == 1
    with pytest.raises(ConfigError, match="0 or 1"):
        ElasticSettings(replicas=2)


def test_replication_s_messages_are_handled_before_the_pushes_queued_with_them() -> None:
    from trimtab.roles.server.priority import by_priority
    from trimtab.transport import Envelope

    def env(header: dict[str, Any]) -> Envelope:
        return Envelope(b"peer", [memoryview(encode({**header, "j": "job"}))])

    batch = [
        env({"o": int(Data.PUSH), "i": 1, "c": 3}),
        env({"o": int(Data.ACK), "i": 2}),  # a handover's: keeps its place
        env({"o": int(Data.PUSH), "i": 3, "c": 1}),
        env({"o": int(Data.REPLICATE), "i": replica.FIRST_RID, "c": 9}),
        env({"o": int(Data.ACK), "i": replica.FIRST_RID + 5}),  # a replication's
    ]
    order = [(h or {}).get("i") for _, _, h in by_priority(batch, b"coordinator", "job")]
    assert order == [replica.FIRST_RID, replica.FIRST_RID + 5, 1, 2, 3]


def test_a_backup_that_cannot_map_shared_memory_gets_the_bytes_instead() -> None:
    primary, loop, _, stops = link(server(0, [0, 1], [1, 0]))
    primary.replicas.store.servers = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")  # local
    released: list[int] = []
    try:
        primary.after(0, [lambda: released.append(0)], [])
        first = loop.sent[-1][1]
        assert "sm" in first  # through this server's arena
        refusal = {"code": ErrorCode.NO_SHM.value, "msg": "cannot map"}
        assert primary.answer(b"tcp://127.0.0.1:2", int(Data.ERROR), first["i"], refusal)
        again = loop.sent[-1][1]
        assert "sm" not in again and again["i"] != first["i"] and not stops  # the bytes
        assert primary.answer(b"tcp://127.0.0.1:2", int(Data.ACK), again["i"], {})
        assert released == [0]
    finally:
        primary.replicas.arenas.close()


@settings(max_examples=200, deadline=None)
@given(
    servers=st.integers(2, 5),
    chunks=st.integers(1, 12),
    data=st.data(),
)
def test_role_moves_reach_any_wanted_map_in_two_steps_always_held_twice(
    servers: int, chunks: int, data: st.DataObject
) -> None:
    """Live placement with replicas: each step moves a chunk only onto its backup (which
    holds it) or gives it a new backup, never co-locates a chunk and its backup, and two
    steps reach any map the policy wants."""
    sizes = data.draw(st.lists(st.integers(1, 1000), min_size=chunks, max_size=chunks))
    server = st.integers(0, servers - 1)
    owners = data.draw(st.lists(server, min_size=chunks, max_size=chunks))
    wanted = data.draw(st.lists(server, min_size=chunks, max_size=chunks))
    backups = policy.backups(owners, sizes, range(servers))
    for _ in range(2):
        new_owners, new_backups = policy.role_moves(owners, backups, wanted, sizes, range(servers))
        for cid in range(chunks):
            assert new_owners[cid] in (owners[cid], backups[cid])  # only onto the backup
            assert new_backups[cid] != new_owners[cid] and new_backups[cid] >= 0
            if new_owners[cid] != owners[cid]:  # the old owner still holds it: the backup
                assert new_backups[cid] == owners[cid]
        owners, backups = new_owners, new_backups
    assert owners == wanted


def test_role_moves_take_backups_off_a_draining_server() -> None:
    owners, backups = [0, 1, 2], [1, 2, 0]
    new_owners, new_backups = policy.role_moves(owners, backups, [1, 1, 0], [8, 8, 8], [0, 1])
    assert new_owners == [1, 1, 0]  # chunks 0 and 2 swap onto their backups
    assert new_backups[1] == 0 and 2 not in new_backups  # chunk 1's backup leaves 2


def test_with_psld_s_speeds_a_chunk_moved_off_a_slow_server_is_not_backed_up_there() -> None:
    """A swap would leave the slow old owner as the backup, and every round's values
    would wait for its acknowledgement: with speeds, backups go to fast servers, and a
    slow server keeps none; a chunk wanted on it still gets there (two steps)."""
    owners, backups = [2, 2, 0, 1], [0, 1, 2, 2]
    speeds = [1.0, 1.0, 0.2]
    new_owners, new_backups = policy.role_moves(
        owners, backups, [0, 1, 0, 1], [8] * 4, [0, 1, 2], speeds
    )
    assert new_owners == [0, 1, 0, 1]  # both swapped onto their backups
    assert 2 not in new_backups and all(
        b != o for b, o in zip(new_backups, new_owners, strict=True)
    )
    wanted = [2, 1, 0, 1]  # the policy gives chunk 0 back to the slow server
    step, backed = policy.role_moves(new_owners, new_backups, wanted, [8] * 4, [0, 1, 2], speeds)
    assert backed[0] == 2  # first its backup
    step, backed = policy.role_moves(step, backed, wanted, [8] * 4, [0, 1, 2], speeds)
    assert step == wanted
