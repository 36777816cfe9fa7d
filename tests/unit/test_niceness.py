"""A role started at the lowest priority takes the job's back (trimtab.launch.niceness):
all of its threads and its session's group, or, where it may not, none of them. Each
case runs in a process of its own, started as the test bed starts a late server (its own
session, lowered before exec), so that this one's priority is never touched."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys

import pytest

from trimtab.errors import ConfigError
from trimtab.launch import niceness

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="thread priorities are Linux's")

#: In the child: three threads made while low, then restore(to), then every nice value.
RESTORE = """
import json, sys, threading
from trimtab.launch import niceness
hold = threading.Event()
threads = [threading.Thread(target=hold.wait) for _ in range(3)]
for t in threads:
    t.start()
before = niceness.nices()
try:
    niceness.restore(int(sys.argv[1]))
    refused = None
except OSError as exc:
    refused = type(exc).__name__
after = niceness.nices()
hold.set()
print(json.dumps({"before": before, "after": after, "refused": refused}))
"""


def _unprivileged() -> None:  # pragma: no cover - in the child before exec
    """Without CAP_SYS_NICE after exec (dropped from the bounding set: even root's
    process then lacks it) and without RLIMIT_NICE's leave to raise a priority."""
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    if ctypes.CDLL(None, use_errno=True).prctl(24, 23, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        raise OSError(ctypes.get_errno(), "cannot drop CAP_SYS_NICE")


def _low(demote: bool = False) -> None:  # pragma: no cover - in the child before exec
    niceness.lower()
    if demote:
        _unprivileged()


def _run_low(to: int, demote: bool = False) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RESTORE, str(to)],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        preexec_fn=lambda: _low(demote),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    return json.loads(done.stdout)


def test_a_lowered_process_takes_back_the_priority_on_every_thread_or_on_none() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    got = _run_low(mine)
    threads, group = got["before"]
    assert threads == [niceness.START_NICE] * 4  # the main thread and the three it made
    assert group in (niceness.START_NICE, None)  # (None: the kernel does not group)
    if niceness.why_not(mine) is None:
        assert got["refused"] is None
        assert got["after"] == [[mine] * 4, None if group is None else 0]
    else:  # nothing changed: no half state
        assert got["refused"] == "PermissionError"
        assert got["after"] == got["before"]


def test_without_the_right_to_raise_it_nothing_changes_and_the_reason_is_given() -> None:
    """Without CAP_SYS_NICE (this test drops it from its child, which needs
    CAP_SETPCAP: root): raising nice 19 back to 0 is refused before anything changed,
    and why_not says why."""
    if os.geteuid() != 0:
        pytest.skip("dropping a child's CAP_SYS_NICE needs root (CAP_SETPCAP)")
    got = _run_low(0, demote=True)
    assert got["refused"] == "PermissionError"
    assert got["after"] == got["before"]
    assert got["before"][0] == [niceness.START_NICE] * 4
    said = subprocess.run(
        [sys.executable, "-c", "from trimtab.launch import niceness; print(niceness.why_not(0))"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_unprivileged,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    ).stdout
    assert "needs root (CAP_SYS_NICE) or RLIMIT_NICE 20" in said


def test_the_serving_nice_is_a_nice_value() -> None:
    assert niceness.serving_nice({}) is None
    assert niceness.serving_nice({niceness.ENV: ""}) is None
    assert niceness.serving_nice({niceness.ENV: "0"}) == 0
    assert niceness.serving_nice({niceness.ENV: "-5"}) == -5
    for bad in ("x", "20", "-21", "1.5"):
        with pytest.raises(ConfigError, match=niceness.ENV):
            niceness.serving_nice({niceness.ENV: bad})
