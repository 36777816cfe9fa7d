"""The launcher's supervision (:meth:`trimtab.launch.job.Job._supervise`) over scripted
role handles, no process started: a coordinator killed at any moment of a pass is
replaced, never taken for a failed job (CI once saw it die between the pass's two
looks at it: "exited with status -9 while workers were running; stopping the job")."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from trimtab.launch.backends.base import RoleHandle
from trimtab.launch.job import Job, LaunchConfig
from trimtab.launch.procs import Proc


class Scripted(RoleHandle):
    """A role that runs until its ``dies_at``-th poll (or until ``ended`` is set), then
    exits with ``code``."""

    def __init__(self, code: int, dies_at: int | None = None) -> None:
        self.code = code
        self.dies_at = dies_at
        self.polls = 0
        self.ended = threading.Event()

    def poll(self) -> int | None:
        self.polls += 1
        if self.ended.is_set() or (self.dies_at is not None and self.polls >= self.dies_at):
            return self.code
        return None

    def signal(self, sig: int, group: bool = False) -> None:
        self.ended.set()

    def lines(self) -> Iterator[bytes]:
        return iter(())


def _proc(source: str, handle: RoleHandle) -> Proc:
    reader = threading.Thread(target=lambda: None)
    reader.start()  # (its output read: the launcher joins it)
    return Proc(source, handle, reader)


@pytest.mark.parametrize("dies_at", range(1, 8))
def test_a_coordinator_killed_at_any_poll_of_a_pass_is_replaced(
    dies_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    config = LaunchConfig(workers=1, servers=1)
    job = Job(config, ["true"], output=lambda source, line: said.append(line))
    worker, server = Scripted(0), Scripted(0)
    server.ended = worker.ended  # (told to stop at the job's end)
    job._procs = [
        _proc("coordinator", Scripted(-signal.SIGKILL, dies_at=dies_at)),
        _proc("server 0", server),
        _proc("worker 0", worker),
    ]
    replaced: list[int] = []

    def replace(p: Proc, code: int, workers: list[Proc]) -> None:
        # The replacement ends the job at once (every worker done), as a real one would
        # once the worker finished.
        replaced.append(code)
        job._procs.remove(p)
        job._procs.append(_proc("coordinator", Scripted(0, dies_at=1)))
        worker.ended.set()

    monkeypatch.setattr(job, "_replace_coordinator", replace)
    assert job._supervise() == 0, said
    assert replaced == [-signal.SIGKILL], said
    assert not any("stopping the job" in line for line in said), said
