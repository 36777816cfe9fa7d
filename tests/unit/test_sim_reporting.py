"""When the simulated coordinator hears a step: with the next step's first pushes, so
that a map's race against a step's first push is run, not assumed."""

from __future__ import annotations

import numpy as np

from trimtab_tools.sim.datapath import StepInput, ready_shares
from trimtab_tools.sim.reporting import ReportTiming, map_reaches, reports_in


def _step(starts: list[float], compute: list[float], forward_share: float) -> StepInput:
    sizes = np.array([1e6, 1e6])
    return StepInput(
        starts=np.array(starts),
        compute=np.array(compute),
        sizes=sizes,
        owners=np.array([0, 1]),
        shares=ready_shares(sizes, forward_share),
        available=np.full(2, -np.inf),
        proc=np.full(2, 1e12),
        cap=np.full(2, np.inf),
        delay=np.zeros(2),
        update_bps=1e12,
        worker_nic_bps=1e12,
        server_nic_bps=1e8,
        latency_s=0.001,
    )


def test_the_last_report_arrives_with_the_last_workers_first_push() -> None:
    # Every gradient at the compute's end: the later worker's report leaves at 1.0 + 0.2.
    assert reports_in(_step([1.0, 1.0], [0.1, 0.2], 1.0), 0.001) == 1.0 + 0.2 + 0.001
    # Backward hands the last chunk over after the forward share and its bytes' share.
    x = _step([0.0, 0.0], [0.3, 0.3], 1 / 3)
    first = 0.3 * (1 / 3 + (2 / 3) * 0.5)
    assert abs(reports_in(x, 0.0) - first) < 1e-12
    assert map_reaches(2.0, 0.02, 0.001) == 2.0 + 0.021


def test_a_steps_reports_wait_for_the_next_steps_first_push_the_last_steps_do_not() -> None:
    sent: list[tuple[float, str]] = []

    def at(when: float, action: object) -> None:
        sent.append((when, str(getattr(action, "__name__", action))))

    def report0(now: float) -> None: ...
    def report1(now: float) -> None: ...

    timing = ReportTiming(at, 0.001, steps=2, at_end=False)
    timing.step(0, _step([0.0, 0.0], [0.1, 0.1], 1.0), 0.5, report0)
    assert sent == []  # held: no push of step 1 yet
    timing.step(1, _step([0.5, 0.6], [0.1, 0.1], 1.0), 0.9, report1)
    assert sent == [(0.7 + 0.001, "report0"), (0.9 + 0.001, "report1")]  # the last at its end
    sent.clear()
    elastic = ReportTiming(at, 0.0, steps=5, at_end=True)  # reported before each barrier
    elastic.step(0, _step([0.0, 0.0], [0.1, 0.1], 1.0), 0.5, report0)
    assert sent == [(0.5, "report0")]
