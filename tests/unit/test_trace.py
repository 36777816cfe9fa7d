"""The trace's arithmetic, with injected clocks: NTP's offset estimate from the
heartbeats' round trips, when a correction is applied, the merged file on the
coordinator's clock, and the cap on events."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from trimtab.errors import ConfigError
from trimtab.observe.timeline import CoordinatorTrace, merge, prepare
from trimtab.protocol import headers
from trimtab.protocol.messages import Header, decode, encode
from trimtab.runtime.loop import Heartbeat
from trimtab.runtime.trace import ClockSync, Trace, trace_from


class Clock:
    """A settable clock: ``skew`` seconds ahead of the true time ``t``."""

    def __init__(self, skew: float = 0.0) -> None:
        self.t = 1_000.0
        self.skew = skew

    def __call__(self) -> float:
        return self.t + self.skew


def wire(header: Any) -> Header:
    """``header`` as the other end decodes it."""
    header["j"] = "job"
    return decode(memoryview(encode(header)), "job")


def round_trip(
    member: Clock, coordinator: Clock, trace: Trace, out_s: float, back_s: float
) -> None:
    """One heartbeat and its echo, through the real builders and readers: ``out_s`` on
    the way to the coordinator, ``back_s`` on the way back (true seconds)."""
    beat = wire(Heartbeat(1, 5).header(trace))
    member.t += out_s
    coordinator.t = member.t
    echo = wire(headers.heartbeat_echo(beat, coordinator()))
    member.t += back_s
    Heartbeat.echoed(echo, trace)


def test_the_offset_is_estimated_from_the_shortest_round_trip() -> None:
    member, coordinator = Clock(skew=5.0), Clock()  # the member's clock 5 s ahead
    trace = Trace("unused", "worker-0", clock=member)
    round_trip(member, coordinator, trace, 0.004, 0.001)  # asymmetric: off by 1.5 ms
    assert trace.sync.offset == pytest.approx(-5.0 + 0.0015, abs=1e-9)
    assert trace.sync.rtt == pytest.approx(0.005)
    round_trip(member, coordinator, trace, 0.0002, 0.0002)  # short and even: exact
    round_trip(member, coordinator, trace, 0.010, 0.0)  # longer: not kept
    sync = trace.sync
    assert sync.samples == 3
    assert sync.rtt == pytest.approx(0.0004)
    assert sync.offset == pytest.approx(-5.0, abs=1e-9)
    assert sync.correction() == sync.offset  # far beyond its error bound: applied
    # A member's time plus the correction reads the coordinator's.
    assert member() + sync.correction() == pytest.approx(coordinator(), abs=1e-6)


def test_an_offset_within_its_error_bound_is_not_applied() -> None:
    # One host, one clock: each estimate is within half its round trip, by causality.
    member = coordinator = Clock()
    trace = Trace("unused", "server-0", clock=member)
    round_trip(member, coordinator, trace, 0.0003, 0.0001)
    assert trace.sync.offset == pytest.approx(0.0001)
    assert abs(trace.sync.offset) <= trace.sync.rtt / 2
    assert trace.sync.correction() == 0.0
    # No sample at all (a job shorter than a heartbeat): no correction either.
    assert ClockSync().correction() == 0.0


def test_samples_that_cannot_be_used_are_ignored() -> None:
    sync = ClockSync()
    sync.add(10.0, 50.0, 9.0)  # our clock stepped back during the round trip
    assert sync.samples == 0 and sync.offset is None
    untraced = headers.heartbeat()
    assert "ts" not in untraced  # untraced, the heartbeat is as before
    assert "tn" not in headers.heartbeat_echo(untraced, 1.0)
    assert headers.read_clock({"o": 3, "i": 0, "ts": 1.0, "tn": "x"}) is None
    Heartbeat.echoed({"o": 3, "i": 0, "ts": 1.0, "tn": 2.0}, None)  # untraced: nothing


def test_the_merged_trace_puts_every_process_on_the_coordinators_clock(tmp_path: Path) -> None:
    coordinator, server = Clock(), Clock(skew=-2.0)  # the server's clock 2 s behind
    coord = Trace(tmp_path, "coordinator", clock=coordinator)
    follow = CoordinatorTrace(coord)  # (an Events listener: its events carry their t)
    srv = Trace(tmp_path, "server-0", clock=server)
    round_trip(server, coordinator, srv, 0.0001, 0.0001)
    # A push merged on the server at true time 1 000.5, then a step report at 1 000.6.
    server.t = coordinator.t = 1_000.5
    start = srv.now()
    server.t += 0.001
    srv.span("merge", 3, start, step=7, rank=1)
    srv.mark("reply", 3, step=7, rank=1)
    follow({"seq": 1, "t": 1_000.6, "kind": "step", "rank": 1, "clock": 7})
    srv.write()
    coord.write()
    (tmp_path / "notes.json").write_text("{}")  # not a trace: refused, not merged
    with pytest.raises(ValueError, match="not a trimtab trace"):
        merge(tmp_path)
    (tmp_path / "notes.json").unlink()

    merged = json.loads(merge(tmp_path).read_text())
    names = {
        e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {1: "coordinator", 2: "server-0"}
    timed = {e["name"]: e for e in merged["traceEvents"] if e["ph"] != "M"}
    assert timed["merge"]["ts"] == pytest.approx(1_000.5e6, abs=1)  # corrected by +2 s
    assert timed["merge"]["dur"] == pytest.approx(1_000, abs=1)
    assert timed["merge"]["args"] == {"step": 7, "worker": 1}
    assert timed["reply"]["ts"] == pytest.approx(1_000.501e6, abs=1)
    assert timed["step"]["ts"] == pytest.approx(1_000.6e6, abs=1)
    assert timed["step"]["args"]["rank"] == 1
    rows = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in merged["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert rows[(2, 3)] == "chunk 3" and rows[(1, timed["step"]["tid"])] == "step"
    sync = {p["process"]: p for p in merged["otherData"]["trimtab"]["processes"]}
    assert sync["server-0"]["correction_s"] == pytest.approx(2.0, abs=1e-6)
    assert sync["coordinator"]["correction_s"] == 0.0


def test_events_past_the_cap_are_dropped_counted_and_said(tmp_path: Path, caplog) -> None:
    trace = Trace(tmp_path, "worker-0", limit=3)
    with caplog.at_level(logging.WARNING, logger="trimtab.trace"):
        for step in range(5):
            trace.mark("push", 0, step, 0)
    assert len(trace.events) == 3 and trace.dropped == 2
    assert sum("3 events kept, the rest dropped" in r.message for r in caplog.records) == 1
    written = json.loads(trace.save().read_text())  # type: ignore[union-attr]
    assert written["otherData"]["trimtab"]["dropped"] == 2
    assert [e["args"]["step"] for e in written["traceEvents"]] == [0, 1, 2]


def test_the_environment_and_the_directory() -> None:
    assert trace_from({}, "worker-0") is None
    trace = trace_from({"TRIMTAB_TRACE": "/tmp/t", "TRIMTAB_TRACE_EVENTS": "10"}, "worker-0")
    assert trace is not None and trace.limit == 10
    with pytest.raises(ConfigError, match="TRIMTAB_TRACE_EVENTS must be a positive"):
        trace_from({"TRIMTAB_TRACE": "/tmp/t", "TRIMTAB_TRACE_EVENTS": "0"}, "worker-0")


def test_prepare_removes_an_earlier_jobs_trace_files_only(tmp_path: Path) -> None:
    for name in ("worker-3.json", "server-0.json", "coordinator.json", "trace.json", "mine.json"):
        (tmp_path / name).write_text("{}")
    assert prepare(tmp_path) == tmp_path.resolve()
    assert [p.name for p in tmp_path.iterdir()] == ["mine.json"]
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="--trace"):
        prepare(tmp_path / "file" / "below")
