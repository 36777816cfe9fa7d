"""The live view of a real job (a coordinator, two servers and two workers as processes
on loopback): the dashboard's address printed at start, ``/metrics`` scraped twice
while it runs, the page and its stream, the run record it leaves, and ``trimtab
report`` on that record, checked against the record's events."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import processes_of
from tests.observe_script import training_script
from trimtab.launch.job import Job, LaunchConfig
from trimtab.observe.settings import ObserveSettings

pytest.importorskip("starlette", reason="the dashboard needs the observe extra")
pytest.importorskip("prometheus_client", reason="/metrics needs the observe extra")

SCRIPT = training_script(0.03)

DASHBOARD = re.compile(r"dashboard at (http://127\.0\.0\.1:\d+/)")


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return bytes(reply.read())


def samples(text: str) -> dict[str, float]:
    """Prometheus' text format: sample (with labels) -> value."""
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


class Seen:
    """What the test saw of the running job."""

    scrapes: list[str]
    page: bytes
    chart_lib: bytes
    polled: dict
    streamed: bytes
    lines: list[str]
    status: int
    record: Path


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> Seen:
    tmp = tmp_path_factory.mktemp("observe")
    (tmp / "train.py").write_text(SCRIPT)
    config = LaunchConfig(
        workers=2,
        servers=2,
        rebalance_every=10,
        chunk_bytes=4096,
        observe=ObserveSettings(runs_dir=str(tmp / "runs")),
    )
    out = Seen()
    out.lines = []
    url: list[str] = []
    ready = threading.Event()

    def output(source: str, line: str) -> None:
        out.lines.append(f"[{source}] {line}")
        if (m := DASHBOARD.search(line)) and source == "coordinator":
            url.append(m.group(1))
            ready.set()

    job = Job(config, [sys.executable, str(tmp / "train.py"), "80"], output=output)
    runner = threading.Thread(target=lambda: setattr(out, "status", job.run()))
    runner.start()
    try:
        assert ready.wait(30), out.lines
        base = url[0]
        deadline = time.monotonic() + 30
        while True:  # until a step was reported
            first = get(base + "metrics")
            if re.search(rb"^trimtab_steps_total [1-9]", first, re.M):
                break
            assert time.monotonic() < deadline, "no step was reported"
            time.sleep(0.2)
        time.sleep(1.0)
        out.scrapes = [first.decode(), get(base + "metrics").decode()]
        out.page = get(base)
        out.chart_lib = get(base + "static/uplot/uPlot.iife.min.js")
        out.polled = json.loads(get(base + "api/events?since=0"))
        with urllib.request.urlopen(base + "api/stream?since=0", timeout=5) as stream:
            out.streamed = stream.read(4096)
    finally:
        runner.join(60)
    assert not runner.is_alive()
    assert processes_of(config.job) == []
    out.record = tmp / "runs" / config.job
    return out


def test_the_dashboard_is_printed_at_start_and_serves_the_page_offline(seen: Seen) -> None:
    assert seen.status == 0, seen.lines
    assert b"uPlot.iife.min.js" in seen.page and b"http" not in seen.page.replace(
        b"http-equiv", b""
    ), "the page loads nothing from another site"
    assert seen.chart_lib.startswith(b"/*! https://github.com/leeoniya/uPlot")
    kinds = {e["kind"] for e in seen.polled["events"]}
    assert {"job", "member", "placement", "step"} <= kinds
    assert seen.streamed.startswith(b"retry:") and b"\ndata: [" in seen.streamed


def test_two_scrapes_of_metrics_differ_and_every_documented_metric_is_there(seen: Seen) -> None:
    from trimtab.observe.metrics import METRICS

    first, second = (samples(s) for s in seen.scrapes)
    assert second["trimtab_steps_total"] > first["trimtab_steps_total"] > 0
    assert first != second
    page = (Path(__file__).parents[2] / "docs" / "observe.md").read_text()
    documented = re.findall(r"^\| `(trimtab_\w+)`", page, re.M)
    assert sorted(documented) == sorted(name for name, _, _ in METRICS)
    for name, kind, _ in METRICS:
        assert f"# TYPE {name} {kind}" in seen.scrapes[1], name
    # No per-chunk label anywhere.
    assert "chunk=" not in seen.scrapes[1]


def test_the_run_record_holds_config_events_metrics_and_summary(seen: Seen) -> None:
    config = json.loads((seen.record / "config.json").read_text())
    assert config["launch"]["workers"] == 2 and config["coordinator"]["num_servers"] == 2
    events = [json.loads(line) for line in (seen.record / "events.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["kind"] == "end" and events[-1]["why"] is None
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 2 * 80
    summary = json.loads((seen.record / "summary.json").read_text())
    assert summary["steps"] == 160 and summary["clock"] == 80
    assert (
        summary["migrations"]
        == sum(e["kind"] == "migration" and e["phase"] == "done" for e in events)
        > 0
    )
    metrics = (seen.record / "metrics.jsonl").read_text().splitlines()
    assert metrics and json.loads(metrics[-1])["steps"] == 160


def test_report_writes_plots_that_match_the_events(seen: Seen, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="trimtab report draws with matplotlib")
    from trimtab.observe.report import PLOTS, series

    done = subprocess.run(
        [sys.executable, "-m", "trimtab", "report", str(seen.record), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for name in PLOTS:
        png = (tmp_path / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert (width, height) == (700, 320)
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(PLOTS)
    events = [json.loads(line) for line in (seen.record / "events.jsonl").read_text().splitlines()]
    plotted = series(events)
    steps = [e for e in events if e["kind"] == "step"]
    for rank in (0, 1):
        line = plotted["step_time.png"][f"worker {rank}"]
        mine = [e for e in steps if e["rank"] == rank]
        assert [x for x, _ in line] == [e["clock"] for e in mine]
        assert [y for _, y in line] == pytest.approx([e["compute_s"] + e["comm_s"] for e in mine])
    assert sum(y for _, y in plotted["throughput.png"]["samples / s"]) == sum(
        e["batch"] for e in steps
    )
    placements = [e for e in events if e["kind"] == "placement"]
    assert [y for _, y in plotted["placement.png"]["server 0"]] == [
        e["chunks"][0] for e in placements
    ]
    assert set(plotted["server_load.png"]) == {"server 0", "server 1"}
    for e in events:
        if e["kind"] == "migration":
            assert f"phase={e['phase']}, epoch={e['epoch']}" in page
