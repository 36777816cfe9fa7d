"""The profiler's pure parts: py-spy's collapsed stacks, /proc readings, role names."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from trimtab_tools.bench import profile

RAW = (
    "thread (4242): MainThread;<module> (/x/trimtab/bench/_datapath_worker.py:86);"
    "step (/x/trimtab/_optimizer.py:419);wait (/usr/lib/python3.11/threading.py:331) 7\n"
    "thread (0x10ab): trimtab-io;_io_loop (/x/trimtab/_worker.py:181) 3\n"
    "garbage line without a count\n"
)


def test_parse_collapsed_reads_threads_frames_and_counts() -> None:
    rows = profile.parse_collapsed(RAW)
    assert rows[0][0] == 4242 and rows[0][1] == "MainThread" and rows[0][3] == 7
    assert rows[0][2][-1] == "wait (/usr/lib/python3.11/threading.py:331)"
    assert rows[1][:2] == (0x10AB, "trimtab-io") and rows[1][3] == 3
    assert len(rows) == 2


def test_frames_are_shortened_to_the_package() -> None:
    assert profile._short("f (/work/main/src/trimtab/_server.py:5)") == "f (trimtab/_server.py:5)"
    assert (
        profile._short("g (/v/lib/python3.11/site-packages/zmq/poll.py:1)") == "g (zmq/poll.py:1)"
    )


def test_thread_stats_see_this_process_threads() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        stats = profile.thread_stats(os.getpid())
    finally:
        stop.set()
        t.join()
    assert os.getpid() in stats and len(stats) >= 2
    assert all(s.user_s >= 0 and s.sys_s >= 0 and s.faults >= 0 for s in stats.values())
    main = stats[os.getpid()]
    d = main - profile.ThreadStat(main.comm, 0.0, 0.0, 0)
    assert d == main


def test_child_roles_names_the_job_processes() -> None:
    # A child whose command line looks like a trimtab server; roles come from argv.
    code = "import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code, "-m", "trimtab", "server"])
    try:
        roles = profile.child_roles(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert [(r.role, r.pid, r.name) for r in roles] == [("server", child.pid, "server-0")]
    assert profile._role_of(["python", "-m", "trimtab_tools.bench._datapath_worker"]) == "worker"
    assert profile._role_of(["python", "-m", "trimtab", "coordinator"]) == "coordinator"
    assert profile._role_of(["python", "-c", "pass"]) is None
