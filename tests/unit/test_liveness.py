"""The coordinator's liveness watch (closed connections, failures, silence) and what a
loss says, without sockets; and a request on a job that is over."""

from __future__ import annotations

import pytest

from trimtab.core.chunks import PlacementMap
from trimtab.errors import JobAborted, ProtocolError
from trimtab.protocol import headers
from trimtab.roles.coordinator.liveness import CLOSED, Liveness, lost_message
from trimtab.roles.coordinator.members import Member, Members, MemberState, Role
from trimtab.roles.worker.client import WorkerClient, WorkerConfig, wait
from trimtab.transport import Fabric


def members() -> Members:
    m = Members(num_workers=2, num_servers=2, max_servers=2)
    m.register(b"s0", {"o": 1, "i": 1, "role": "server", "addr": "tcp://a:1"}, running=False)
    m.register(b"s1", {"o": 1, "i": 1, "role": "server", "addr": "tcp://a:2"}, running=False)
    m.register(b"w0", {"o": 1, "i": 1, "role": "worker", "rank": 0}, running=False)
    m.register(b"w1", {"o": 1, "i": 1, "role": "worker", "rank": 1}, running=False)
    for member in m.by_peer.values():
        member.last_seen = 100.0
    return m


def test_a_closed_connection_is_a_loss_after_the_grace_and_once() -> None:
    m, watch = members(), Liveness(dead_after_s=30.0, grace_s=0.5)
    assert watch.lost(m, [b"s1"], now=100.0) == []  # a DONE may still be queued
    assert watch.wait_s(1.0, now=100.1) == pytest.approx(0.4)
    lost = watch.lost(m, now=100.5)
    assert [(x.role, x.rank, why) for x, why in lost] == [(Role.SERVER, 1, CLOSED)]
    assert watch.lost(m, now=101.0) == []
    assert watch.wait_s(1.0, now=101.0) == 1.0


def test_a_member_that_finished_or_a_stranger_is_no_loss() -> None:
    m, watch = members(), Liveness(dead_after_s=30.0, grace_s=0.0)
    m.worker_done(m.workers[0])
    assert watch.lost(m, [b"w0", b"tool"], now=100.0) == []


def test_silence_is_the_last_resort_and_slowness_is_not_death() -> None:
    m, watch = members(), Liveness(dead_after_s=30.0)
    # Silent for 29 s (a throttled member): alive. Past 30 s: lost.
    assert watch.lost(m, now=129.0) == []
    lost = watch.lost(m, now=131.0)
    assert len(lost) == 1 and "silent for 31s" in lost[0][1]


def test_what_a_lost_server_or_worker_says() -> None:
    m = members()
    current = PlacementMap(3, (0, 1, 1, 0, 1), ("tcp://a:1", "tcp://a:2"))
    said = lost_message(m.servers[1], CLOSED, current)
    assert said.startswith("server 1 at tcp://a:2 was lost: its connection closed")
    assert "chunks 1, 2, 4 (3 of 5)" in said and "stopping the job" in said
    assert "before any chunk was placed" in lost_message(m.servers[0], CLOSED, None)
    assert lost_message(m.workers[1], "it failed: ValueError: x", current) == (
        "worker 1 was lost: it failed: ValueError: x; stopping the job"
    )


def test_done_carries_a_failure_or_nothing() -> None:
    assert headers.read_done(dict(headers.done())) is None
    assert headers.read_done(dict(headers.done(failed="E: x"))) == "E: x"
    assert len(headers.done(failed="x" * 10_000)["why"]) == 500
    with pytest.raises(ProtocolError):
        headers.read_done({"o": 11, "why": 3})


def test_a_request_on_a_job_that_is_over_has_its_id_and_fails_with_job_aborted() -> None:
    # (A caller reads the id back, as the pusher does: it used to be a KeyError.)
    fabric = Fabric()
    client = WorkerClient(
        WorkerConfig(coordinator="inproc://nobody", job="j"), fabric.transport(bind=False)
    )
    client._fail("the coordinator's connection closed (it exited or was killed)")
    header = dict(headers.pull(chunk=0, epoch=1))
    fut = client.request("inproc://server", header)
    assert isinstance(header["i"], int)
    with pytest.raises(JobAborted, match="connection closed"):
        wait(fut, 1.0)


def test_member_states_a_lost_member_is_not_finished() -> None:
    member = Member(Role.WORKER, 0, b"w", state=MemberState.LEFT)
    assert not member.finished  # a worker that left but whose process dies is lost
