"""``--fault`` specs (:mod:`trimtab.faults.kills`) and where a victim dies
(:mod:`trimtab.faults.crash`), on synthetic headers with the kill replaced by an
exception; the launcher's bookkeeping of the deaths it caused (:mod:`trimtab.launch.faults`)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from trimtab.errors import ConfigError
from trimtab.faults import crash
from trimtab.faults.kills import Action, FaultSpec, Phase, marker, parse_faults, read_marker
from trimtab.faults.throttle import ThrottledTransport
from trimtab.launch.coordinator import coordinator_argv, replacement_argv
from trimtab.launch.faults import FaultWatch
from trimtab.launch.spec import LaunchConfig
from trimtab.protocol import headers
from trimtab.protocol.messages import Control
from trimtab.settings import CheckpointSettings
from trimtab.transport import Transport


def test_parses_kills_joins_and_phases() -> None:
    specs = parse_faults(
        ["server:1:kill@30", "worker:2:kill@60:mid-push; worker:+1@90", "worker:0:kill@5"]
    )
    assert specs == [
        FaultSpec("server", Action.KILL, 30, 1, Phase.APPLIED),
        FaultSpec("worker", Action.KILL, 60, 2, Phase.MID_PUSH),
        FaultSpec("worker", Action.JOIN, 90, count=1),
        FaultSpec("worker", Action.KILL, 5, 0, Phase.BEFORE_PUSH),
    ]
    assert [str(s) for s in specs] == [
        "server:1:kill@30",
        "worker:2:kill@60:mid-push",
        "worker:+1@90",
        "worker:0:kill@5",
    ]
    assert parse_faults("worker:1:kill@3:after-reply")[0].phase is Phase.AFTER_REPLY
    migrating = parse_faults("server:2:kill@8:migrating")[0]
    assert migrating.phase is Phase.MIGRATING and str(migrating) == "server:2:kill@8:migrating"
    assert parse_faults("") == []
    coordinator = parse_faults("coordinator:1:kill@7")[0]
    assert coordinator == FaultSpec("coordinator", Action.KILL, 7, 1, Phase.APPLIED)
    assert str(coordinator) == "coordinator:1:kill@7"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("server:1:kill", "'@STEP' is missing"),
        ("router:1:kill@3", "role 'router'"),
        ("server:x:kill@3", "index 'x'"),
        ("server:1:stop@3", "action 'stop'"),
        ("server:1:kill@soon", "step 'soon'"),
        ("server:1:kill@-2", "step -2 must be >= 0"),
        ("worker:1:kill@3:halfway", "phase 'halfway'"),
        ("server:1:kill@3:mid-push", "phase 'mid-push' is for workers"),
        ("server:+1@3", "only workers join"),
        ("worker:+0@3", "count 0"),
        ("worker:+1@3:mid-push", "phase 'mid-push' is for kills"),
        ("worker:1@3", "needs three parts"),
        ("coordinator:0:kill@3:mid-push", "phase 'mid-push' is for workers and servers"),
    ],
)
def test_a_bad_spec_names_its_bad_part(text: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_faults(text)
    assert names in str(info.value)
    assert repr(text) in str(info.value)


def test_the_launcher_refuses_a_fault_naming_a_process_the_job_never_has() -> None:
    with pytest.raises(ConfigError, match="only 3 servers"):
        LaunchConfig(workers=2, servers=3, faults=("server:3:kill@5",))
    with pytest.raises(ConfigError, match="only 2 workers"):
        LaunchConfig(workers=2, servers=3, faults=("worker:2:kill@5",))
    # a joined worker may be killed too
    LaunchConfig(workers=2, servers=3, faults=("worker:+1@5", "worker:2:kill@9"))


def test_marker_reads_back_through_a_launcher_prefix() -> None:
    spec = parse_faults("worker:1:kill@7:mid-push")[0]
    body = read_marker("[worker 1] " + marker(spec, 12.5, chunks_pushed=3))
    assert body is not None
    assert body["spec"] == "worker:1:kill@7:mid-push"
    assert (body["step"], body["phase"], body["at"], body["chunks_pushed"]) == (
        7,
        "mid-push",
        12.5,
        3,
    )
    assert read_marker("[worker 1] step 7 done") is None
    assert read_marker("TRIMTAB_FAULT {not json") is None


class Died(Exception):
    pass


@pytest.fixture
def deaths(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def die(spec: FaultSpec, **facts: Any) -> None:
        seen.append({"spec": str(spec), **facts})
        raise Died(str(spec))

    monkeypatch.setattr(crash, "die", die)
    return seen


def push(rank: int, clock: int, chunk: int) -> dict[str, Any]:
    return dict(
        headers.push(
            chunk=chunk,
            epoch=1,
            dtype="f32",
            numel=4,
            rank=rank,
            clock=clock,
            weight=8.0,
            version=clock,
        )
    )


def value(clock: int, chunk: int) -> dict[str, Any]:
    return dict(
        headers.value(rid=1, chunk=chunk, version=clock + 1, round=clock, numel=4, dtype="f32")
    )


def run_step(w: crash.WorkerCrash, rank: int, clock: int, chunks: int = 6) -> None:
    for c in range(chunks):
        w.sending(push(rank, clock, c))
        w.sent(push(rank, clock, c))
    for c in range(chunks):
        w.received(value(clock, c))


def test_before_push_dies_before_the_first_push_of_its_step(deaths: list[Any]) -> None:
    w = crash.WorkerCrash(parse_faults("worker:1:kill@2"))
    run_step(w, 1, 0)
    run_step(w, 1, 1)
    with pytest.raises(Died):
        w.sending(push(1, 2, 0))
    assert deaths == [{"spec": "worker:1:kill@2", "chunks_pushed": 0}]


def test_only_the_named_rank_dies(deaths: list[Any]) -> None:
    w = crash.WorkerCrash(parse_faults("worker:1:kill@2; worker:1:kill@1:after-reply"))
    for clock in range(4):
        run_step(w, 0, clock)
    assert deaths == []


def test_mid_push_dies_after_half_of_the_chunks_left(deaths: list[Any]) -> None:
    w = crash.WorkerCrash(parse_faults("worker:0:kill@1:mid-push"))
    run_step(w, 0, 0)
    for c in range(2):
        w.sending(push(0, 1, c))
        w.sent(push(0, 1, c))
    w.sending(push(0, 1, 2))
    with pytest.raises(Died):
        w.sent(push(0, 1, 2))  # the third of six has left: it dies now
    assert deaths == [{"spec": "worker:0:kill@1:mid-push", "chunks_pushed": 3, "chunks_before": 6}]


def test_after_reply_dies_once_every_chunk_of_its_step_is_answered(deaths: list[Any]) -> None:
    w = crash.WorkerCrash(parse_faults("worker:0:kill@1:after-reply"))
    run_step(w, 0, 0)
    for c in range(6):
        w.sending(push(0, 1, c))
        w.sent(push(0, 1, c))
    for c in range(5):
        w.received(value(1, c))
    w.received(value(0, 5))  # an old round's answer does not count
    assert deaths == []
    with pytest.raises(Died):
        w.received(value(1, 5))
    assert deaths == [{"spec": "worker:0:kill@1:after-reply", "chunks_answered": 6}]


class Node:
    index = -1


def test_a_server_dies_at_its_first_value_of_the_step(deaths: list[Any]) -> None:
    s = crash.ServerCrash(parse_faults("server:1:kill@3; worker:1:kill@3"))
    node = Node()
    s.follow(node)
    s.sending(value(5, 0))  # not registered yet: no index, no kill
    node.index = 0
    s.sending(value(5, 0))  # another server
    node.index = 1
    s.sending(value(2, 0))
    s.sending(push(0, 3, 0))  # not a value
    # a PULL answered between rounds: the next round, the version before it
    s.sending(dict(headers.value(rid=1, chunk=0, version=3, round=3, numel=4, dtype="f32")))
    assert deaths == []
    with pytest.raises(Died):
        s.sending(value(3, 4))
    assert deaths == [{"spec": "server:1:kill@3", "chunk": 4, "version": 4}]


def test_a_server_dies_as_the_first_migration_after_its_step_reaches_it(
    deaths: list[Any],
) -> None:
    s = crash.ServerCrash(parse_faults("server:1:kill@3:migrating"))
    node = Node()
    node.index = 1
    s.follow(node)
    migrate = {"o": int(Control.MIGRATE), "epoch": 5}
    s.sending(value(2, 0))
    s.received(migrate)  # a migration before step 3 is applied here: no kill
    s.sending(value(3, 4))  # step 3 applied, its value leaves: the applied point is not this spec's
    s.received({"o": int(Control.MAP_NEWS), "epoch": 6})  # not a migration
    assert deaths == []
    with pytest.raises(Died):
        s.received(migrate)
    assert deaths == [{"spec": "server:1:kill@3:migrating", "epoch": 5, "round": 3}]


def test_a_coordinator_dies_at_the_first_report_of_its_step(deaths: list[Any]) -> None:
    c = crash.CoordinatorCrash(parse_faults("coordinator:0:kill@3; server:0:kill@1"))
    report = dict(
        headers.report(clock=2, batch=8, compute_s=0, comm_s=0, cpu_share=0, floor=1, spans=[])
    )
    c.received(report)
    c.received({**report, "o": int(Control.MAP_GET)})
    assert deaths == []
    with pytest.raises(Died):
        c.received({**report, "k": 4})  # a report of a later step counts too
    assert deaths == [{"spec": "coordinator:0:kill@3", "clock": 4}]


def test_each_coordinator_is_given_the_kills_of_its_number() -> None:
    config = LaunchConfig(
        workers=2, servers=1, faults=("coordinator:0:kill@3", "coordinator:1:kill@9")
    )
    first = coordinator_argv(config, "127.0.0.1", CheckpointSettings())
    assert [a for a in first if a.startswith("--fault")] == ["--fault=coordinator:0:kill@3"]
    second = replacement_argv(config, "h", CheckpointSettings(resume="/x"), "tcp://h:9", [1], 1)
    assert [a for a in second if a.startswith("--fault")] == ["--fault=coordinator:1:kill@9"]
    assert second[second.index("--port") + 1] == "9" and "--rejoin" in second
    assert second[second.index("--done-workers") + 1] == "1"
    assert second[second.index("--resume") + 1] == ""  # the servers hold the parameters


@pytest.mark.parametrize("wrapper", [crash.CrashingTransport, ThrottledTransport])
def test_a_wrapping_transport_passes_every_call_on(wrapper: type[Transport]) -> None:
    # One it left to Transport's default would answer for the transport it wraps: a
    # server wrapped for --fault once never learned of closed connections (lost()).
    calls = {n for n, v in vars(Transport).items() if callable(v) and not n.startswith("_")}
    assert sorted(calls - set(vars(wrapper))) == []


def test_untouched_where_no_spec_kills_the_role() -> None:
    inner: Any = object()
    assert crash.wrap_worker(inner, parse_faults("server:0:kill@1"), "job") is inner
    assert crash.wrap_server(inner, parse_faults("worker:0:kill@1"), "job") == (inner, None)


def test_the_launcher_knows_its_own_kills_and_when_joins_are_due() -> None:
    watch = FaultWatch(parse_faults("worker:1:kill@4; worker:+1@6; worker:+2@9"))
    spec = parse_faults("worker:1:kill@4")[0]
    watch.saw("worker 1", "[x] " + marker(spec, 1.0))
    assert watch.injected_death("worker 0", -signal.SIGKILL) is None  # no marker
    assert watch.injected_death("worker 1", 1) is None  # not a SIGKILL
    assert watch.injected_death("worker 1", -signal.SIGKILL) is not None
    assert [m["spec"] for m in watch.injected] == ["worker:1:kill@4"]
    assert watch.joins_pending
    assert watch.due_joins({"0": 5, "1": 4}) == 0
    assert watch.due_joins({"0": 6}) == 1
    assert watch.due_joins({"0": 6}) == 0  # each join once
    assert watch.due_joins({"0": 12, "2": 3}) == 2
    assert not watch.joins_pending
