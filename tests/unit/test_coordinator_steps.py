"""The coordinator's step reports, barriers and broadcasts as pure operations, and its
dispatch table driven one message at a time over the in-process transport."""

from __future__ import annotations

from typing import Any

import pytest

from trimtab.errors import ProtocolError
from trimtab.policies.batching import BATCHING
from trimtab.policies.detection import DEFAULT_DETECTOR, DETECTORS
from trimtab.policies.psld import SpeedEstimator
from trimtab.protocol.messages import Control, decode, encode
from trimtab.roles.coordinator import Coordinator, CoordinatorConfig
from trimtab.roles.coordinator.collectives import Collectives
from trimtab.roles.coordinator.members import Member, Members
from trimtab.roles.coordinator.outbox import Refuse, Send
from trimtab.roles.coordinator.steps import REPORT_EVERY_S, Steps, report_interval_s
from trimtab.transport import Fabric


def workers(n: int) -> list[Member]:
    members = Members(n, 1, 1)
    for w in range(n):
        members.register(b"w%d" % w, {"o": 1, "i": 1, "role": "worker", "rank": w}, running=False)
    return [members.workers[w] for w in range(n)]


def report(clock: int, batch: int = 4, compute_s: float = 0.1, **extra: Any) -> dict[str, Any]:
    header = {"o": int(Control.REPORT), "i": 30 + clock, "k": clock, "b": batch}
    return {**header, "cs": compute_s, "ms": 0.01, "cpu": 1.0, **extra}


def steps(n: int, batching: str = "equal", *, skips: bool = False) -> Steps:
    detector = DETECTORS.create(DEFAULT_DETECTOR)
    return Steps(n, BATCHING.create(batching), detector, skips_stragglers=skips)


def test_equal_batching_answers_each_report_at_once_with_the_published_epoch() -> None:
    w = workers(2)
    st = steps(2)
    clock, sample = st.record(w[0], report(0))
    assert (clock, sample.batch, st.clocks, st.boundary()) == (0, 4, {0: 1}, None)
    assert st.reply(w[0], 30, clock, sample, epoch=3) == [
        Send(b"w0", {"o": int(Control.OK), "i": 30, "epoch": 3})
    ]
    st.record(w[1], report(0))
    assert st.boundary() == 1 and st.job_clock == 1
    assert report_interval_s(per_step=False) == REPORT_EVERY_S
    assert report_interval_s(per_step=True) == 0.0


def test_adaptive_batching_answers_every_worker_once_the_step_is_complete() -> None:
    w = workers(2)
    st = steps(2, "lbbsp")
    c, fast = st.record(w[0], report(0, batch=6, compute_s=0.1))
    assert st.reply(w[0], 30, c, fast, epoch=0) == []  # waits for worker 1's report
    c, slow = st.record(w[1], report(0, batch=6, compute_s=0.3))
    out = st.reply(w[1], 31, c, slow, epoch=0)
    assert [(m.peer, m.header["i"]) for m in out] == [(b"w0", 30), (b"w1", 31)]
    sizes = out[0].header["sizes"]
    assert sum(sizes) == 12 and sizes[0] > sizes[1]  # the faster worker gets more


def test_a_lagging_worker_is_told_to_refresh_and_skip_ahead_under_saps() -> None:
    w = workers(3)
    st = steps(3, skips=True)
    for k in range(10):
        st.record(w[0], report(k))
        st.record(w[1], report(k))
    st.record(w[2], report(0))
    for _ in range(2):  # the detector wants the lag twice in a row
        clock, sample = st.record(w[2], report(1))
        reply = st.reply(w[2], 1, clock, sample, epoch=0)[0].header
    assert reply["refresh"] is True and reply["lead"] == 10
    assert "refresh" not in steps(3).reply(w[2], 1, clock, sample, epoch=0)[0].header


def test_traffic_reaches_the_speed_estimator_once_every_worker_reported_the_step() -> None:
    w = workers(2)
    st = steps(2)
    speeds = SpeedEstimator()
    st.observe_traffic(0, [[0, 0.5, 0.2, 1000.0]], 1, speeds)
    assert speeds.observed(0) is None
    st.observe_traffic(0, [[0, 0.25, 0.1, 1000.0]], 1, speeds)
    # All bytes over the longest first span (a lower bound) and the shortest wait span.
    assert speeds.observed(0) == (4000.0, 20000.0)
    for bad in ([[1, 0.1, 0.1, 5.0]], [["0", 0.1, 0.1, 5.0]], [[0, 0.1]], 7):
        with pytest.raises(ProtocolError, match="bad per-server spans") as exc:
            st.observe_traffic(1, bad, 1, speeds)
        assert exc.value.args[0] == "malformed"
    with pytest.raises(ProtocolError, match="bad step report"):
        st.record(w[0], report(1, batch=0))
    with pytest.raises(ProtocolError, match="'cs'"):
        st.record(w[0], {**report(1), "cs": "slow"})


def test_a_barrier_releases_everyone_once_all_arrived() -> None:
    c = Collectives(3)
    assert c.barrier(b"a", 1, "x") == [] and c.barrier(b"b", 2, "x") == []
    assert c.barrier(b"a", 3, "y") == []  # another barrier meanwhile
    out = c.barrier(b"c", 4, "x")
    assert [(m.peer, m.header) for m in out] == [
        (b"a", {"o": int(Control.OK), "i": 1}),
        (b"b", {"o": int(Control.OK), "i": 2}),
        (b"c", {"o": int(Control.OK), "i": 4}),
    ]
    assert c.barrier(b"b", 5, "x") == []  # a new round under the same name


def test_a_broadcast_reaches_each_other_worker_before_or_after_the_put() -> None:
    c = Collectives(3)
    frames = [memoryview(b"value")]
    assert c.get(b"b", 1, 1, "k") == []
    out = c.put(b"a", 2, 0, "k", {"shape": [5]}, frames)
    # The value to the worker that asked; the root waits until every worker took it.
    assert out == [
        Send(b"b", {"o": int(Control.BCAST_VALUE), "i": 1, "meta": {"shape": [5]}}, frames)
    ]
    with pytest.raises(ProtocolError, match="'k' was already put"):
        c.put(b"a", 3, 0, "k", {}, frames)
    out = c.get(b"c", 4, 2, "k")  # the last one: the root is answered, the value dropped
    assert [(m.peer, m.header["o"]) for m in out] == [
        (b"c", int(Control.BCAST_VALUE)),
        (b"a", int(Control.OK)),
    ]
    assert out[1].header["i"] == 2  # type: ignore[union-attr]
    assert c.get(b"c", 5, 2, "k") == []  # waits for a new put


def test_a_replacement_coordinator_learns_who_took_a_broadcast_and_answers_its_root() -> None:
    # The coordinator died after worker 1 took the value and before worker 2 asked:
    # the replacement gets worker 1's replayed get, the root's put sent again, then
    # worker 2's get, in any order of the first two.
    for replay_first in (True, False):
        c = Collectives(3)
        frames = [memoryview(b"value")]
        out: list[Any] = []
        if replay_first:
            assert c.get(b"b", 7, 1, "k", replayed=True) == []  # nothing answers a replay
        out += c.put(b"a", 2, 0, "k", {}, frames)
        if not replay_first:
            out += c.get(b"b", 7, 1, "k", replayed=True)
        assert out == []  # worker 2 has not taken it
        out = c.get(b"c", 4, 2, "k")
        assert [(m.peer, m.header["o"]) for m in out] == [
            (b"c", int(Control.BCAST_VALUE)),
            (b"a", int(Control.OK)),
        ]


def test_a_broadcasts_root_is_refused_when_a_worker_leaves_without_taking_it() -> None:
    c = Collectives(3)
    c.put(b"a", 2, 0, "k", {}, [memoryview(b"v")])
    c.get(b"b", 3, 1, "k")
    (refused,) = c.left(2)
    assert isinstance(refused, Refuse) and refused.peer == b"a" and refused.rid == 2
    assert "worker 2 left the job without taking it" in refused.msg
    # An elastic job that loses a worker counts those taking part: the root is answered.
    c = Collectives(3)
    c.put(b"a", 2, 0, "k", {}, [memoryview(b"v")])
    c.get(b"b", 3, 1, "k")
    assert c.resize(2) == [Send(b"a", {"o": int(Control.OK), "i": 2})]
    # One that admits a worker does not wait for it: it joined after the put.
    c = Collectives(2)
    c.put(b"a", 2, 0, "k", {}, [memoryview(b"v")])
    assert c.resize(3) == []
    assert [m.peer for m in c.get(b"b", 3, 1, "k")] == [b"b", b"a"]
    # A worker cannot take one value twice, nor its root take its own.
    c = Collectives(3)
    c.put(b"a", 2, 0, "k", {}, [memoryview(b"v")])
    c.get(b"b", 3, 1, "k")
    for peer, rank in ((b"b", 1), (b"a", 0)):
        (again,) = c.get(peer, 4, rank, "k")
        assert isinstance(again, Refuse) and "taken by this worker already" in again.msg


def test_the_dispatch_table_answers_in_protocol_and_refuses_the_rest() -> None:
    fabric = Fabric()
    coordinator = Coordinator(CoordinatorConfig(1, 1, "j"), fabric.transport(bind=True))
    node = fabric.transport(bind=False)
    to = node.connect(coordinator.address)

    def ask(header: dict[str, Any]) -> dict[str, Any] | None:
        node.send(to, [encode({"j": "j", "i": 9, **header})])
        env = coordinator._transport.recv(1.0)
        assert env is not None
        coordinator._dispatch(env.peer, env.frames)  # the loop's step, without a thread
        reply = node.recv(0.0)
        return None if reply is None else decode(reply.frames[0], "j")

    assert ask({"o": int(Control.HEARTBEAT)}) is None  # may overtake REGISTER
    refused = ask({"o": int(Control.BARRIER), "name": "x"})
    assert refused is not None and refused["code"] == "bad_state"
    assert "before REGISTER" in refused["msg"]
    status = ask({"o": int(Control.STATUS)})
    assert status is not None and status["o"] == int(Control.OK) and status["epoch"] == 0
    registered = ask({"o": int(Control.REGISTER), "role": "worker"})
    assert registered is not None and registered["rank"] == 0
    unknown = ask({"o": 99})
    assert unknown is not None and unknown["code"] == "unknown_op"
    bad = ask({"o": int(Control.REPORT), "k": "x"})
    assert bad is not None and bad["code"] == "malformed"
    scale = ask({"o": int(Control.SCALE), "servers": 1})
    assert scale is not None and scale["target"] == 1
    node.close()
    coordinator._transport.close()
