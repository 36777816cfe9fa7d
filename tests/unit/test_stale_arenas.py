"""Arenas go away with their owner: named after the process that made them, and removed
by the next worker or launcher once that process is gone (issue 20: SIGKILL leaves no
chance to clean up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from trimtab.transport.shm import (
    SHM_DIR,
    Arena,
    owner_of,
    remove_own_arenas,
    remove_stale_arenas,
)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_arena_names_its_owner() -> None:
    arena = Arena.create("job1", "w0", 64)
    try:
        assert owner_of(arena.name) == os.getpid()
    finally:
        arena.close()
    assert owner_of("trimtab-job-w0-123-0a1b2c3d") == 123
    assert owner_of("trimtab-job-w0-0a1b2c3d") is None
    assert owner_of("other-job-w0-123-0a1b2c3d") is None


def test_stale_arenas_go_and_live_ones_stay(tmp_path: Path) -> None:
    gone, alive = dead_pid(), os.getppid()
    names = {
        "stale": f"trimtab-j-w1-{gone}-0a1b2c3d",
        "live": f"trimtab-j-w0-{alive}-0a1b2c3d",
        "mine": f"trimtab-j-w2-{os.getpid()}-0a1b2c3d",
        "foreign": "trimtab-something-else",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert remove_stale_arenas(tmp_path) == [names["stale"]]
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {names["live"], names["mine"], names["foreign"]}
    remove_own_arenas(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {names["live"], names["foreign"]}


def test_a_worker_killed_by_sigterm_removes_its_arena_first(tmp_path: Path) -> None:
    # What init() installs, in a process of its own: SIGTERM (a launcher's death
    # signal) removes the arenas, then the process dies of SIGTERM as before.
    script = textwrap.dedent("""
        import sys, time
        from trimtab.frontend.api import _remove_arenas_on_sigterm
        from trimtab.transport.shm import Arena
        _remove_arenas_on_sigterm()
        print(Arena.create("sigterm-test", "w0", 4096).name, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    assert (SHM_DIR / name).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    time.sleep(0.1)
    assert not (SHM_DIR / name).exists()
