"""The dashboard's server over an event stream (no job): it stops promptly with a
stream reader attached, and the launcher's status line follows it (plain lines where
the output is not a terminal)."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from trimtab.roles.coordinator.events import Events

pytest.importorskip("starlette", reason="the dashboard needs the observe extra")


def feed(events: Events) -> None:
    events.emit("job", job="j", workers=2, servers=2, placement="psld", consistency="bsp",
                batching="equal", chunk_bytes=1024)  # fmt: skip
    for role, rank in (("server", 0), ("server", 1), ("worker", 0), ("worker", 1)):
        events.emit("member", role=role, rank=rank, state="active")
    events.emit("placement", epoch=1, chunks=[2, 1], bytes=[20, 10], owners=[0, 1, 0])
    for clock in range(3):
        for rank in (0, 1):
            events.emit("step", rank=rank, clock=clock, batch=8, compute_s=0.01, comm_s=0.002,
                        cpu=1.0, lag=0)  # fmt: skip
    events.emit("straggler", role="server", rank=1, why="slow")


def test_the_dashboard_stops_promptly_with_a_stream_reader_attached() -> None:
    from trimtab.observe.dashboard import Dashboard
    from trimtab.observe.live import bind
    from trimtab.observe.metrics import Metrics

    events = Events()
    feed(events)
    dashboard = Dashboard(events, Metrics(), bind("127.0.0.1", 0))
    assert dashboard.url.startswith("http://127.0.0.1:")
    got: list[bytes] = []
    ended = threading.Event()

    def read() -> None:
        with urllib.request.urlopen(dashboard.url + "api/stream?since=0", timeout=10) as s:
            while chunk := s.read1(65536):
                got.append(chunk)
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while b"straggler" not in b"".join(got):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    dashboard.close()
    assert ended.wait(5), "the stream did not end with the server"
    assert time.monotonic() - started < 4


def test_the_status_line_follows_the_stream_in_plain_lines_without_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trimtab.observe import terminal
    from trimtab.observe.dashboard import Dashboard
    from trimtab.observe.live import bind
    from trimtab.observe.metrics import Metrics

    monkeypatch.setattr(terminal, "LOG_EVERY_S", 0.0)
    events = Events()
    feed(events)
    dashboard = Dashboard(events, Metrics(), bind("127.0.0.1", 0))
    line = terminal.StatusLine(terminal=False)
    try:
        line("worker 0", "hello")
        line("worker 1", 'TRIMTAB_PROGRESS {"step": 3, "total": 9, "loss": 0.25}')
        line("worker 0", 'TRIMTAB_PROGRESS {"step": 3, "total": 9, "accuracy": 0.5}')
        line("server 0", 'TRIMTAB_PROGRESS {"loss": 9.0}')  # (only workers report)
        line("coordinator", f"trimtab coordinator: dashboard at {dashboard.url} (...)")
        deadline = time.monotonic() + 10
        while line.state.steps < 6:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.2)
    finally:
        line.close()
        dashboard.close()
    out = capsys.readouterr().out
    assert "[worker 0] hello" in out
    said = [x for x in out.splitlines() if x.startswith("[trimtab] step 3 | ")]
    assert said and said[-1].endswith(
        " samples/s | loss 0.250 | accuracy 0.500 | servers 2 | workers 2 | epoch 1 | "
        "migrations 0 | stragglers server 1"
    )


def test_the_figures_a_script_reports_are_read_from_its_marker_lines() -> None:
    from trimtab.observe.figures import reported

    assert reported('TRIMTAB_PROGRESS {"step": 1, "loss": 0.5, "accuracy": 1}') == {
        "loss": 0.5,
        "accuracy": 1.0,
    }
    assert reported('TRIMTAB_RESULT {"test_accuracy": 0.97, "final_loss": 0.01}') == {
        "loss": 0.01,
        "accuracy": 0.97,
    }
    for other in (
        "loss 0.5",
        "TRIMTAB_PROGRESS {not json",
        "TRIMTAB_PROGRESS [1, 2]",
        'TRIMTAB_PROGRESS {"loss": "low", "accuracy": true}',
        'TRIMTAB_PROGRESS {"loss": NaN}',
    ):
        assert reported(other) == {}, other


def test_without_the_extra_the_coordinator_says_how_to_get_it_and_runs_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from trimtab.observe import live
    from trimtab.observe.settings import ObserveSettings

    monkeypatch.setattr(live, "missing_extra", lambda: ["uvicorn"])
    events = Events()
    feed(events)
    view = live.Live(events, ObserveSettings(runs_dir=str(tmp_path)), "j", {"num_workers": 2})
    try:
        assert view.dashboard is None and view.metrics is None
        assert any(
            "no dashboard and no /metrics: uvicorn missing (pip install 'trimtab[observe]'" in line
            for line in view.lines
        ), view.lines
        assert view.state.steps == 6  # the events before it listened, replayed
    finally:
        view.close()
    assert (tmp_path / "j" / "summary.json").exists()
