"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` package,
driven by Playwright) opens the dashboard of a running 2 x 2 job with psld and a slow
server, sees its charts fill and a migration appear in the timeline, and saves a
screenshot. In the slow tier (a browser and a job of some seconds).

``TRIMTAB_SCREENSHOTS=DIR`` also saves the screenshot there (README's is made so).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.conftest import processes_of
from trimtab.launch.job import Job, LaunchConfig
from trimtab.observe.settings import ObserveSettings

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/lib/chromium/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]

SCRIPT = textwrap.dedent("""
    import sys, time, torch, trimtab
    trimtab.init()
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(8)])
    opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                       model.named_parameters())
    for step in range(int(sys.argv[1])):
        model(torch.ones(8, 128)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.02)
""")

DASHBOARD = re.compile(r"dashboard at (http://127\.0\.0\.1:\d+/)")


def test_the_dashboard_of_a_running_job_shows_its_charts_and_a_migration(tmp_path: Path) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (its browser is not needed)"
    )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no {CHROMIUM}: apt-get install -y chromium (Debian's package)")
    pytest.importorskip("starlette", reason="the dashboard needs the observe extra")
    (tmp_path / "train.py").write_text(SCRIPT)
    config = LaunchConfig(
        workers=2,
        servers=2,
        placement="psld",
        chunk_bytes=16384,
        stragglers=("server:1:delay=100ms/MB",),
        observe=ObserveSettings(runs_dir=str(tmp_path / "runs")),
    )
    lines: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def output(source: str, line: str) -> None:
        lines.append(f"[{source}] {line}")
        if (m := DASHBOARD.search(line)) and source == "coordinator":
            url.append(m.group(1))
            ready.set()

    job = Job(config, [sys.executable, str(tmp_path / "train.py"), "400"], output=output)
    status: list[int] = []
    runner = threading.Thread(target=lambda: status.append(job.run()))
    runner.start()
    try:
        assert ready.wait(30), lines
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(url[0])
                page.wait_for_selector("#timeline .migration", timeout=60_000)
                page.wait_for_function(
                    "() => { const n = window.trimtabDashboard.points();"
                    " return n.step > 20 && n.load > 2 && n.batch > 20 && n.placement > 1; }",
                    timeout=30_000,
                )
                page.wait_for_function(  # some steps after the migration, for the screenshot
                    "() => Math.min(...window.trimtabDashboard.job.clocks.values()) >= 100",
                    timeout=60_000,
                )
                page.wait_for_timeout(1000)  # (a redraw)
                assert page.inner_text("#link") in ("live", "job ended")  # server-sent events
                assert page.locator("#map div").count() > 0  # the placement map, a cell a chunk
                page.wait_for_selector("#timeline .straggler", timeout=30_000)
                assert "role=server, rank=1" in page.inner_text("#timeline .straggler")
                shot = tmp_path / "dashboard.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
                if os.environ.get("TRIMTAB_SCREENSHOTS"):
                    shutil.copy(shot, Path(os.environ["TRIMTAB_SCREENSHOTS"]) / "dashboard.png")
                polling = browser.new_page()  # the fallback, where server-sent events fail
                polling.goto(url[0] + "#poll")
                polling.wait_for_function(
                    "() => window.trimtabDashboard.points().step > 0", timeout=20_000
                )
                assert polling.inner_text("#link") in ("polling", "job ended")
            finally:
                browser.close()
    finally:
        runner.join(120)
    assert status == [0], lines[-20:]
    assert processes_of(config.job) == []
