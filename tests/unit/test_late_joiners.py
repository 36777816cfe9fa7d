"""Which workers started to join the launcher stops once the job has ended
(trimtab.launch.procs.late_joiners), by the seconds since the coordinator's normal exit
given, not measured: no clock in the test."""

from __future__ import annotations

import subprocess
import threading
from typing import Any

from trimtab.launch.procs import JOINER_EXIT_S, Proc, late_joiners

GRACE_S = 10.0


def _proc(source: str) -> Proc:
    popen: Any = subprocess.Popen  # never started: late_joiners reads the name only
    return Proc(source, popen, threading.Thread())


WORKERS = [_proc(f"worker {r}") for r in range(4)]  # 0 and 1 the job's, 2 and 3 joiners


def _stopped(since_s: float, members: set[int]) -> list[str]:
    return [p.source for p in late_joiners(WORKERS, 2, members, since_s, GRACE_S)]


def test_a_joiner_never_counted_stops_soon_one_counted_gets_the_grace() -> None:
    # Worker 3 registered (the coordinator counted it: it may be finishing its script);
    # worker 2 never did (still starting, or waiting for a coordinator that is gone).
    members = {0, 1, 3}
    assert _stopped(0.0, members) == []
    assert _stopped(JOINER_EXIT_S - 0.1, members) == []
    assert _stopped(JOINER_EXIT_S + 0.1, members) == ["worker 2"]
    assert _stopped(GRACE_S - 0.1, members) == ["worker 2"]
    assert _stopped(GRACE_S + 0.1, members) == ["worker 2", "worker 3"]
    # The job's own workers are never stopped as joiners, counted or not.
    assert _stopped(GRACE_S + 5, set()) == ["worker 2", "worker 3"]
