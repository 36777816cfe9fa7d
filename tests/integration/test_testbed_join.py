"""A server the job asks for while it runs, on the test bed: it starts at the lowest
priority, so that its imports and registration do not take the cores the bed's hosts
share with the job (as a joiner on a machine of its own would not), and takes the job's
priority back once it serves (:mod:`trimtab.launch.niceness`)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import processes_of
from tests.testbed import testbed_factory  # noqa: F401 (a fixture)
from trimtab.launch import niceness
from trimtab.launch.hosts import Layout
from trimtab.launch.job import DEADLINE_STATUS, Job, LaunchConfig
from trimtab.launch.testbed import Testbed

# A job across the bed's hosts: the slow tier (`pytest -m slow`, run by .ci/run after the suite).
pytestmark = pytest.mark.slow

Factory = Callable[[int], Testbed]

#: Worker 0 asks for a second server, then trains while it watches that server's
#: priority (its threads' nice values and its session's group's) until it serves.
WATCH = textwrap.dedent("""
    import glob, json, time, torch, trimtab, trimtab.frontend.api
    from trimtab.launch import niceness
    from trimtab.protocol.messages import Control
    trimtab.init()
    job = trimtab.frontend.api.default_context().config.job
    def servers():  # this job's `trimtab server` processes
        found = set()
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                argv = open(cmdline, "rb").read().split(b"\\0")
            except OSError:
                continue
            if b"server" in argv and job.encode() in argv:
                found.add(int(cmdline.split("/")[2]))
        return found
    model = torch.nn.Linear(4, 2)
    opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       model.named_parameters())
    def step():
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    for _ in range(3):
        step()
    [first] = servers()
    trimtab.frontend.api.default_context().call({"o": int(Control.SCALE), "servers": 2})
    deadline = time.monotonic() + 90
    while not servers() - {first} and time.monotonic() < deadline:
        time.sleep(0.005)
    [late] = servers() - {first}
    seen = [niceness.nices(late)]
    while time.monotonic() < deadline:  # training, until it serves at the job's priority
        step()
        seen.append(niceness.nices(late))
        threads, group = seen[-1]
        if group in (0, None) and max(threads) < niceness.START_NICE:
            break
    for _ in range(3):
        step()
    print("SEEN", json.dumps({"late": seen, "first": niceness.nices(first)}), flush=True)
    trimtab.shutdown()
""")


@pytest.mark.timeout(200)
def test_a_late_server_starts_at_the_lowest_priority_and_takes_the_jobs_back_once_serving(
    testbed_factory: Factory,  # noqa: F811
    tmp_path: Path,
) -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if (why := niceness.why_not(mine)) is not None:
        pytest.skip(f"the bed starts late servers at normal priority here: {why}")
    bed = testbed_factory(3)
    h = bed.hosts
    layout = Layout(coordinator=h[0], servers=(h[0], h[1]), workers=(h[2],))
    script = tmp_path / "train.py"
    script.write_text(WATCH)
    config = LaunchConfig(workers=1, servers=1, max_servers=2, deadline_s=150.0)
    lines: list[str] = []
    job = Job(
        config,
        [sys.executable, str(script)],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
        testbed=bed,
        layout=layout,
    )
    status = job.run()
    assert status == 0, "\n".join(lines[-(400 if status == DEADLINE_STATUS else 60) :])
    assert any("servers started later begin at nice 19 until they serve" in x for x in lines)
    [said] = [x for x in lines if x.startswith("[worker 0] SEEN ")]
    seen = json.loads(said.removeprefix("[worker 0] SEEN "))
    (threads, group), *_, (last_threads, last_group) = seen["late"]
    grouped = group is not None  # (the kernel groups sessions: every role has its own)
    # Before it registered: the lowest priority, every thread and its group.
    assert set(threads) == {niceness.START_NICE}
    assert group == (niceness.START_NICE if grouped else None)
    # Serving: the job's, as the first server has it all along.
    assert set(last_threads) == {mine} and last_group == (0 if grouped else None)
    first_threads, first_group = seen["first"]
    assert set(first_threads) == {mine} and first_group == (0 if grouped else None)
    # It said so once it served (as server 1: the second to register).
    assert any(x.startswith("[server 1] server 1 serving: priority back to nice") for x in lines)
    assert processes_of(config.job) == []
