"""A replacement coordinator rebuilds the job from what its members hold (REJOIN), as
pure operations: the member key travels masked, each side proves its secret, a forged
member or coordinator is refused, and a map the servers disagree on ends the job."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_coordinator_migration import TERMS, placed
from trimtab.errors import JobAborted, ProtocolError
from trimtab.policies.placement import PLACEMENTS
from trimtab.protocol import headers, rejoin
from trimtab.protocol.messages import Control, decode, encode
from trimtab.roles.coordinator.collectives import Collectives
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members, MemberState
from trimtab.roles.coordinator.outbox import Outbox, Refuse, Send
from trimtab.roles.coordinator.rejoin import SERVER_GRACE_S, Rejoins
from trimtab.roles.worker.config import WorkerConfig
from trimtab.roles.worker.failover import ControlFailover
from trimtab.runtime import credentials
from trimtab.runtime.rejoin import Rejoin

JOB = "j"
SERVER_KEY = b"s" * 32
MEMBER_KEY = b"m" * 32


def job_map(epoch: int = 1) -> dict[str, Any]:
    """The job map the servers of :func:`placed` hold."""
    _, maps = placed()
    assert maps.header is not None
    return {**maps.header, "epoch": epoch}


def server_rejoin(
    rank: int,
    nonce: bytes,
    *,
    epoch: int = 1,
    key: bytes = MEMBER_KEY,
    moving: bool = False,
    adopted: int = 0,
) -> dict[str, Any]:
    mask = credentials.key_mask(SERVER_KEY, JOB, nonce)
    return dict(
        rejoin.rejoin_server(
            rank=rank,
            nonce=nonce,
            addr=f"tcp://s{rank}",
            masked_key=credentials.masked(key, mask),
            job_map=job_map(epoch),
            moving=moving,
            ticket=credentials.join_ticket(SERVER_KEY, JOB),
            adopted=adopted,
        )
    )


def worker_rejoin(rank: int, nonce: bytes, token: bytes | None = None) -> dict[str, Any]:
    token = token or credentials.credential(MEMBER_KEY, JOB, credentials.WORKER, rank)
    proof = credentials.rejoin_proof(token, JOB, "worker", nonce)
    return dict(rejoin.rejoin_worker(rank=rank, nonce=nonce, proof=proof, floor=1))


def fresh() -> tuple[Rejoins, Members, Maps]:
    rejoins = Rejoins(JOB, SERVER_KEY, 2, (), wait_s=60)
    return rejoins, Members(2, 2, 2), Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))


def back(
    rejoins: Rejoins, members: Members, maps: Maps, peer: bytes, header: dict[str, Any]
) -> Outbox:
    """A REJOIN, as the coordinator takes it: then the job rebuilt if it can be."""
    return rejoins.take(peer, header, members) + rejoins.poll(members, maps)


def nonce(n: int) -> bytes:
    return bytes([n]) * rejoin.NONCE_BYTES


def sent_to(out: Outbox, peer: bytes) -> list[Send | Refuse]:
    return [m for m in out if m.peer == peer]


def test_the_job_is_rebuilt_once_every_member_is_back_and_each_proof_holds() -> None:
    rejoins, members, maps = fresh()
    out = back(rejoins, members, maps, b"w1", worker_rejoin(1, nonce(1)))
    assert out == [] and rejoins.missing() == ["every server"]  # the key comes with one
    out += back(rejoins, members, maps, b"s0", server_rejoin(0, nonce(2)))
    out += back(rejoins, members, maps, b"w0", worker_rejoin(0, nonce(3)))
    assert rejoins.missing() == ["server 1"] and not rejoins.rebuilt
    out += back(rejoins, members, maps, b"s1", server_rejoin(1, nonce(4)))
    assert rejoins.rebuilt and rejoins.key == MEMBER_KEY
    # Members as they were: servers by index, active; workers by rank, their floors.
    assert [(m.rank, m.peer, m.state) for m in members.servers] == [
        (0, b"s0", MemberState.ACTIVE),
        (1, b"s1", MemberState.ACTIVE),
    ]
    assert {r: (m.peer, m.floor) for r, m in members.workers.items()} == {
        0: (b"w0", 1),
        1: (b"w1", 1),
    }
    # The map as the servers hold it; nothing is sent to place it again.
    _, before = placed()
    assert maps.map == before.map and maps.sizes == before.sizes
    assert maps.tables == before.tables and not maps.pending
    # Each member's REJOINED proves what it checks: a server, the server key; a
    # worker, its credential (over the nonce it sent).
    for peer, n, secret in [
        (b"s0", 2, SERVER_KEY),
        (b"s1", 4, SERVER_KEY),
        (b"w0", 3, credentials.credential(MEMBER_KEY, JOB, credentials.WORKER, 0)),
        (b"w1", 1, credentials.credential(MEMBER_KEY, JOB, credentials.WORKER, 1)),
    ]:
        (reply,) = sent_to(out, peer)
        assert isinstance(reply, Send) and reply.header["o"] == Control.REJOINED
        member = Rejoin(JOB, 30)
        member.begin("gone")
        member.nonce = nonce(n)
        assert not member.end(reply.header["pf"], b"another secret")  # a forgery: ignored
        assert member.away and member.end(reply.header["pf"], secret) and not member.away


def test_adoptions_go_on_from_the_newest_a_server_s_chunk_took() -> None:
    """The dead coordinator's adoptions are counted in the servers' chunks: the
    replacement's next adoption is newer than any (an older number is a replay there)."""
    rejoins, members, maps = fresh()
    assert rejoins.adoptions() == 0
    back(rejoins, members, maps, b"s0", server_rejoin(0, nonce(1), adopted=3))
    back(rejoins, members, maps, b"s1", server_rejoin(1, nonce(2)))  # (none: no "ad")
    assert rejoins.adoptions() == 3
    collectives = Collectives(2)
    collectives.adoptions = rejoins.adoptions()  # as the rebuilt coordinator takes it
    collectives.adopt(b"w0", 1, 0, lambda root, n: b"g")
    (sent,) = collectives.adopt(b"w1", 1, 0, lambda root, n: b"g")[:1]
    assert isinstance(sent, Send) and sent.header["ad"] == 4


def test_a_worker_without_its_credential_neither_rejoins_nor_displaces_the_real_one() -> None:
    rejoins, members, maps = fresh()
    forged = worker_rejoin(0, nonce(9), token=b"x" * credentials.CREDENTIAL_BYTES)
    out = back(rejoins, members, maps, b"forger", forged)
    for rank in (0, 1):
        out += back(rejoins, members, maps, b"s%d" % rank, server_rejoin(rank, nonce(rank)))
    out += back(rejoins, members, maps, b"w1", worker_rejoin(1, nonce(5)))
    assert rejoins.missing() == ["worker 0"]  # the forger's proof counts for nothing
    out += back(rejoins, members, maps, b"w0", worker_rejoin(0, nonce(6)))
    assert rejoins.rebuilt and members.workers[0].peer == b"w0"
    (refused,) = sent_to(out, b"forger")
    assert isinstance(refused, Refuse) and refused.code == "forbidden"


def test_a_server_needs_the_join_ticket_and_the_job_s_member_key() -> None:
    rejoins, members, _ = fresh()
    no_ticket = {k: v for k, v in server_rejoin(0, nonce(1)).items() if k != "tk"}
    with pytest.raises(ProtocolError, match="join ticket"):
        rejoins.take(b"s0", no_ticket, members)
    rejoins.take(b"s0", server_rejoin(0, nonce(1)), members)
    with pytest.raises(ProtocolError, match="member key differs"):
        rejoins.take(b"s1", server_rejoin(1, nonce(2), key=b"k" * 32), members)
    # Masked, the key is not in the message; another nonce masks it otherwise.
    sent = server_rejoin(0, nonce(1))
    assert MEMBER_KEY not in sent["mk"] and sent["mk"] != server_rejoin(0, nonce(2))["mk"]


@pytest.mark.parametrize("moving", [False, True], ids=["epochs-differ", "mid-migration"])
def test_servers_that_disagree_on_the_map_end_the_job_saying_to_resume(moving: bool) -> None:
    rejoins, members, maps = fresh()
    rejoins.take(b"s0", server_rejoin(0, nonce(1), moving=moving), members)
    rejoins.take(b"s1", server_rejoin(1, nonce(2), epoch=1 if moving else 2), members)
    for rank in (0, 1):
        rejoins.take(b"w%d" % rank, worker_rejoin(rank, nonce(3 + rank)), members)
    with pytest.raises(JobAborted, match="--resume"):
        rejoins.rebuild(members, maps)
    aborts = rejoins.aborts("why")
    assert sorted(m.peer for m in aborts) == [b"s0", b"s1", b"w0", b"w1"]


def test_workers_that_ended_are_done_and_missing_members_end_the_job_in_time() -> None:
    rejoins = Rejoins(JOB, SERVER_KEY, 2, done=(1,), wait_s=0)
    members, maps = Members(2, 2, 2), Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    rejoins.take(b"s0", server_rejoin(0, nonce(1)), members)
    rejoins.take(b"w0", worker_rejoin(0, nonce(2)), members)
    late = rejoins.late()
    assert late is not None and "server 1" in late and "worker" not in late
    with pytest.raises(JobAborted, match="waited in vain for server 1"):
        rejoins.poll(members, maps)
    rejoins.take(b"s1", server_rejoin(1, nonce(3)), members)
    assert rejoins.missing() == []
    rejoins.rebuild(members, maps)
    assert members.workers[1].state is MemberState.DONE and 1 not in {
        m.rank for m in members.by_peer.values() if m.role.value == "worker"
    }


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"role": "tool"}, "unknown role"),
        ({"n": b"short"}, "'n' 16 bytes"),
        ({"mk": b"k" * 31}, "'mk' must be"),
        ({"jm": None}, "jm"),
        ({"rank": -1}, "'rank' must be >= 0"),
        ({"ad": -1}, "'ad' must be >= 0"),
    ],
)
def test_a_malformed_rejoin_is_refused(change: dict[str, Any], why: str) -> None:
    header = {**server_rejoin(0, nonce(1)), **change}
    with pytest.raises(ProtocolError, match=why):
        rejoin.read_rejoin(header)


def test_a_server_not_back_in_time_is_left_to_liveness_unless_it_rejoins() -> None:
    rejoins, members, maps = fresh()
    out = back(rejoins, members, maps, b"s0", server_rejoin(0, nonce(1)))
    for rank in (0, 1):
        out += back(rejoins, members, maps, b"w%d" % rank, worker_rejoin(rank, nonce(2 + rank)))
    assert out == [] and not rejoins.ready()  # server 1 may be on its way
    rejoins.started -= SERVER_GRACE_S  # (the grace has passed)
    out = rejoins.poll(members, maps)
    assert rejoins.rebuilt and sorted(m.peer for m in out) == [b"s0", b"w0", b"w1"]
    # Server 1 is a member not heard from: liveness takes it for lost in time (its
    # chunks' backups own them, or the job ends naming them).
    absent = members.servers[1]
    assert absent.state is MemberState.ACTIVE and members.by_peer[absent.peer] is absent
    assert members.silent(absent.last_seen + 31, 30) is not None
    # Back before that, it takes its place.
    (rejoined,) = rejoins.take(b"s1", server_rejoin(1, nonce(5)), members)
    assert isinstance(rejoined, Send) and rejoined.header["o"] == Control.REJOINED
    assert members.servers[1].peer == b"s1" and members.by_peer[b"s1"].rank == 1
    with pytest.raises(ProtocolError, match="too late"):  # twice, or a worker: no place
        rejoins.take(b"s1-again", server_rejoin(1, nonce(6)), members)
    with pytest.raises(ProtocolError, match="too late"):
        rejoins.take(b"w9", worker_rejoin(0, nonce(7)), members)


def test_an_elastic_job_is_rebuilt_with_the_workers_the_servers_count() -> None:
    # Worker 1 was lost and worker 2 joined before the coordinator died: the servers'
    # map says [0, 2] take part. Worker 2 is awaited (and may rejoin), worker 1 is lost.
    rejoins, members, maps = fresh()
    counted = {**job_map(), "workers": [0, 2]}
    for rank in (0, 1):
        header = {**server_rejoin(rank, nonce(1 + rank)), "jm": counted}
        back(rejoins, members, maps, b"s%d" % rank, header)
    back(rejoins, members, maps, b"w0", worker_rejoin(0, nonce(3)))
    assert rejoins.missing() == ["worker 2"] and rejoins.taking_part() == [0, 2]
    out = back(rejoins, members, maps, b"w2", worker_rejoin(2, nonce(4)))
    assert rejoins.rebuilt and sorted(m.peer for m in out) == [b"s0", b"s1", b"w0", b"w2"]
    states = {r: m.state for r, m in members.workers.items()}
    assert states == {0: MemberState.ACTIVE, 1: MemberState.LOST, 2: MemberState.ACTIVE}
    # The job map a server joining later learns the workers from says them.
    assert maps.header is not None and maps.header["workers"] == [0, 2]


def test_a_server_waiting_for_a_replacement_takes_only_its_proof_or_the_job_s_end() -> None:
    # A SHUTDOWN read as its coordinator's connection closed (the job's normal end)
    # still ends the server; a MAP from a coordinator that proved nothing does not pass.
    from trimtab.roles.server.config import ServerConfig
    from trimtab.roles.server.coordlink import CoordinatorLink
    from trimtab.roles.server.meter import LoadMeter

    class Wire:
        def connect(self, address: str) -> bytes:
            return b"o:" + address.encode()

    config = ServerConfig(coordinator="inproc://c", job=JOB, server_key=SERVER_KEY)
    link = CoordinatorLink(config, Wire(), None, LoadMeter(), lambda nonce: None)  # type: ignore[arg-type]
    assert link.take({"o": int(Control.MAP)})  # not away: as ever
    link.rejoin.begin("gone")
    assert not link.take({"o": int(Control.MAP)})
    assert all(link.take({"o": int(op)}) for op in (Control.SHUTDOWN, Control.ABORT))
    proof = credentials.rejoin_proof(SERVER_KEY, JOB, "coordinator", link.rejoin.nonce)
    assert not link.take(dict(rejoin.rejoined(proof=b"x" * 16))) and link.rejoin.away
    assert not link.take(dict(rejoin.rejoined(proof=proof))) and not link.rejoin.away


def test_a_worker_replays_its_last_broadcast_taken_then_its_unanswered_requests() -> None:
    config = WorkerConfig(coordinator="tcp://127.0.0.1:1", job=JOB)
    failover = ControlFailover(config, None, b"c", None)  # type: ignore[arg-type]

    def message(header: Any, rid: int) -> list[Any]:
        return [encode({**header, "i": rid, "j": JOB})]

    failover.sent(4, message(headers.bcast_get(key="bcast0"), 4), Control.BCAST_GET)
    failover.answered(4, Control.BCAST_VALUE)  # taken
    failover.sent(5, message(headers.bcast_get(key="bcast1"), 5), Control.BCAST_GET)
    failover.answered(5, Control.ERROR)  # refused: not taken, not replayed
    put = message(headers.bcast_put(key="bcast2", meta={}), 6)
    failover.sent(6, put, Control.BCAST_PUT)  # its root's OK waits for every worker
    failover.rejoin.begin("the coordinator died")
    proof = credentials.rejoin_proof(MEMBER_KEY, JOB, "coordinator", failover.rejoin.nonce)
    usual, again = failover.take(dict(rejoin.rejoined(proof=proof)), MEMBER_KEY)
    assert not usual and len(again) == 2 and again[1] is put
    replay = decode(again[0][0], JOB)
    assert (replay["o"], replay["key"], replay["rp"]) == (Control.BCAST_GET, "bcast0", True)
