"""The coordinator's membership, without threads or sockets: registration, the member
state machine, scaling, and when a drained server may retire."""

from __future__ import annotations

import pytest

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Control
from trimtab.roles.coordinator.members import Member, Members, MemberState, Role
from trimtab.roles.coordinator.outbox import Send


def server(members: Members, n: int, *, running: bool = False) -> Member:
    header = {"o": int(Control.REGISTER), "i": 1, "role": "server", "addr": f"tcp://s{n}"}
    return members.register(b"s%d" % n, header, running=running)


def worker(members: Members, rank: int | None = None) -> Member:
    header = {"o": int(Control.REGISTER), "i": 1, "role": "worker"}
    if rank is not None:
        header["rank"] = rank
    return members.register(b"w%d" % len(members.workers), header, running=False)


def job(workers: int = 2, servers: int = 2, max_servers: int = 0) -> Members:
    members = Members(workers, servers, max_servers or servers)
    for s in range(servers):
        server(members, s)
    for _ in range(workers):
        worker(members)
    return members


def code_of(exc: pytest.ExceptionInfo[ProtocolError]) -> str:
    return str(exc.value.args[0])


def test_registration_gives_ranks_and_refuses_what_does_not_fit() -> None:
    members = Members(2, 1, 2)
    first = server(members, 0)
    assert (first.role, first.rank, first.state) == (Role.SERVER, 0, MemberState.JOINED)
    with pytest.raises(
        ProtocolError, match=r"already has its 1 servers \(it may grow to 2 when asked"
    ) as e:
        server(members, 1)
    assert code_of(e) == "bad_state"
    assert worker(members, 1).rank == 1 and worker(members).rank == 0  # the free one
    with pytest.raises(ProtocolError, match="no worker rank free"):
        worker(members)
    with pytest.raises(ProtocolError, match="already registered"):
        members.register(b"s0", {"o": 1, "i": 1, "role": "server", "addr": "x"}, running=False)
    with pytest.raises(ProtocolError, match="unknown role 'dealer'") as e:
        members.register(b"x", {"o": 1, "i": 1, "role": "dealer"}, running=False)
    assert code_of(e) == "malformed"


def test_a_running_job_takes_servers_up_to_its_target() -> None:
    members = job(servers=1, max_servers=3)
    with pytest.raises(ProtocolError, match="already has its 1 servers"):
        server(members, 1, running=True)
    assert members.scale_to(9, None) == 3  # bounded by max_servers
    assert members.wanted_servers() == 3
    assert server(members, 1, running=True).rank == 1
    assert server(members, 2, running=True).rank == 2
    with pytest.raises(ProtocolError, match="already has its 3 servers"):
        server(members, 3, running=True)


def test_only_the_listed_state_moves_are_legal() -> None:
    members = job()
    s0, s1 = members.servers
    members.placed([0])
    assert s0.state is MemberState.ACTIVE and s1.state is MemberState.JOINED
    assert members.unsettled()  # server 1 was given nothing yet
    members.placed([0, 1])
    assert not members.unsettled()
    for to in (MemberState.EMPTY, MemberState.RETIRED, MemberState.DONE, MemberState.JOINED):
        with pytest.raises(ProtocolError, match="cannot go from active"):
            s0.move(to)
    with pytest.raises(ProtocolError, match="worker 0 cannot go from active to draining"):
        members.workers[0].move(MemberState.DRAINING)
    members.drain(s1)
    assert s1.state is MemberState.DRAINING and not s1.active and members.unsettled()
    assert members.active_mask() == [True, False]


def test_scaling_in_drains_the_slowest_measured_server() -> None:
    members = job(servers=3)
    members.placed([0, 1, 2])
    assert members.scale_to(2, [10.0, 1.0, 5.0]) == 2
    assert [m.state for m in members.servers] == [
        MemberState.ACTIVE,
        MemberState.DRAINING,
        MemberState.ACTIVE,
    ]
    assert members.scale_to(0, None) == 1  # at least one server
    assert [m.rank for m in members.active_servers()] == [0]  # unmeasured: by index


def test_a_drained_server_retires_once_every_workers_floor_passed_its_emptying() -> None:
    members = job()
    members.placed([0, 1])
    s1 = members.servers[1]
    members.drain(s1)
    assert members.retire_empty(owners=(0, 1), epoch=1) == []  # still owns a chunk
    # Map 2 empties it; worker 0 may still have a request routed by map 1 in flight.
    members.raise_floor(members.workers[1], 2)
    assert members.retire_empty(owners=(0, 0), epoch=2) == []
    assert s1.state is MemberState.EMPTY and s1.empty_at == 2
    assert not members.raise_floor(members.workers[0], 0)  # a floor never goes down
    assert members.raise_floor(members.workers[0], 2)
    out = members.retire_empty(owners=(0, 0), epoch=2)
    assert out == [Send(b"s1", {"o": int(Control.SHUTDOWN), "i": 0})]
    assert s1.state is MemberState.RETIRED and s1.finished
    assert members.retire_empty(owners=(0, 0), epoch=3) == []  # told once
    # The job's end shuts down the servers not retired already.
    assert members.shutdown() == [Send(b"s0", {"o": int(Control.SHUTDOWN), "i": 0})]


def test_done_workers_end_the_job_and_silence_is_noticed() -> None:
    members = job()
    w0, w1 = members.workers[0], members.workers[1]
    assert not members.worker_done(w0)
    assert not members.worker_done(w0)  # a repeated DONE changes nothing
    with pytest.raises(ProtocolError, match="server 0 cannot go from joined to done"):
        members.worker_done(members.servers[0])
    assert members.worker_done(w1)
    w1.last_seen = 0.0  # done: its silence is expected
    members.servers[0].last_seen = 100.0
    assert members.silent(now=130.0, dead_after_s=30.0) is None
    assert members.silent(now=131.0, dead_after_s=30.0) is members.servers[0]
