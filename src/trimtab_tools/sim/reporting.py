"""When a simulated coordinator hears a step, and when its answer reaches a server.

A runtime worker reports step ``k`` with step ``k + 1``'s first push
(``frontend/reports.py``, ``StepReporter.before_push``), not at step ``k``'s end: the
coordinator hears the last report of step ``k`` when the last worker's compute of step
``k + 1`` handed its first gradient over, and a map it decides then leaves it
``ClusterModel.decision_s`` later (PSLD's decision, the migration's start, the map's
publication: 1.4 to 12 ms on the test bed). Whether that map enters a server's
inbound queue before the step's first push there decides whether the server cuts the
moving chunks at the round under way (:mod:`.cuts`). The last step's reports leave at
the job's end (the optimizer's ``flush``); an elastic job's workers report before each
boundary's barrier (``send_now``), at the step's end.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trimtab_tools.sim.datapath import StepInput

__all__ = ["ReportTiming", "map_reaches", "reports_in"]

Action = Callable[[float], None]


def reports_in(x: StepInput, latency_s: float) -> float:
    """When the last report sent with step ``x``'s first pushes reaches the
    coordinator: each worker's first gradient is handed over at its start plus the
    smallest share of its compute (``StepInput.shares``); the report crosses one
    link. Pure."""
    first = x.starts + x.compute * float(np.min(x.shares, initial=1.0))
    return float(first.max(initial=0.0)) + latency_s


def map_reaches(now: float, decision_s: float, latency_s: float) -> float:
    """When a map decided on reports heard at ``now`` reaches a server. Pure."""
    return now + decision_s + latency_s


class ReportTiming:
    """Holds each step's reports until the next step's first pushes send them.

    Args:
        at: schedules an action at a simulated time (the event loop's).
        latency_s: one link's latency.
        steps: the job's steps (the last one's reports leave at its end).
        at_end: every step's reports leave at its end (an elastic job's barrier).

    Not thread-safe; never blocks.
    """

    def __init__(
        self, at: Callable[[float, Action], None], latency_s: float, steps: int, at_end: bool
    ) -> None:
        self._at, self._latency, self._steps, self._at_end = at, latency_s, steps, at_end
        self._held: Action | None = None

    def step(self, k: int, x: StepInput, end: float, report: Action) -> None:
        """Step ``k`` (input ``x``, last end ``end``) was simulated: send the held
        reports of step ``k - 1`` with its first pushes; hold ``report`` (step ``k``'s)
        for the next step's, or send it at ``end`` plus a link where none follows."""
        if self._held is not None:
            self._at(reports_in(x, self._latency), self._held)
            self._held = None
        if self._at_end or k + 1 >= self._steps:
            self._at(end + self._latency, report)
        else:
            self._held = report
