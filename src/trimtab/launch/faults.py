"""The launcher's side of ``--fault`` (:mod:`trimtab.faults.kills`): which deaths it
caused, and when to start a joining worker.

A victim kills itself (:mod:`trimtab.faults.crash`) after printing a marker line, so a
process that printed one and then died of SIGKILL was killed on purpose: the launcher
says so and goes on supervising the rest, whose fate (recovery, or the job's abort)
is then the job's to decide. A join (``worker:+N@STEP``) is started by the launcher as
a worker process given the job's address and no rank, once the coordinator reports a
worker clock at STEP or beyond.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from trimtab.faults.kills import Action, FaultSpec, read_marker


class FaultWatch:
    """What the launcher knows of the faults it injects. Thread-safe: the output readers
    call :meth:`saw`, the supervisor the rest. Never blocks."""

    def __init__(self, specs: Sequence[FaultSpec]) -> None:
        self.specs = tuple(specs)
        self._joins = sorted((s for s in specs if s.action is Action.JOIN), key=lambda s: s.step)
        self._lock = threading.Lock()
        self._marked: dict[str, dict[str, Any]] = {}
        #: The markers of the victims that died, in order (each a dict, see ``marker``).
        self.injected: list[dict[str, Any]] = []

    @property
    def joins_pending(self) -> bool:
        """Whether a join is still to start (the supervisor then polls the clocks)."""
        return bool(self._joins)

    def saw(self, source: str, line: str) -> None:
        """A line ``source`` printed; a marker says it is about to die on purpose."""
        body = read_marker(line)
        if body is not None:
            with self._lock:
                self._marked[source] = body

    def injected_death(self, source: str, status: int) -> dict[str, Any] | None:
        """The marker of ``source``, which exited with ``status``, if that was a kill
        this launcher's specs caused (SIGKILL after a marker); else None. Call once the
        process's output was read to its end."""
        if status != -signal.SIGKILL:
            return None
        with self._lock:
            body = self._marked.pop(source, None)
        if body is not None:
            self.injected.append(body)
        return body

    def due_joins(self, clocks: Mapping[Any, Any]) -> int:
        """How many workers to start now, given the coordinator's worker ``clocks``
        (rank -> clock): those of every join whose step a worker reached. Each join is
        counted once."""
        reached = max((int(c) for c in clocks.values()), default=-1)
        count = 0
        while self._joins and self._joins[0].step <= reached:
            count += self._joins.pop(0).count
        return count
