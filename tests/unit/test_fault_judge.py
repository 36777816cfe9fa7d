"""How ``trimtab experiment faults`` and ``soak`` judge a job from what it showed
(:func:`trimtab_tools.experiments.faultjob.judge`), and the soak's random plans."""

from __future__ import annotations

import itertools
import random
from typing import Any

from trimtab.faults.kills import parse_faults
from trimtab_tools.experiments import samples
from trimtab_tools.experiments.faultjob import Seen, judge
from trimtab_tools.experiments.soak import plan


def records() -> list[dict[str, Any]]:
    """Workers 0 (pid 10) and 1 (pid 11) for steps 0..2; worker 1 dies in step 2 after
    its reply (begun, not done); a joiner (pid 12, rank 2) does step 2."""
    out: list[dict[str, Any]] = []
    for clock in range(3):
        for pid, rank in ((10, 0), (11, 1)):
            out.append({"pid": pid, "rank": rank, "clock": clock, "begin": [clock * 8 + rank]})
            if not (pid == 11 and clock == 2):
                out.append({"pid": pid, "rank": rank, "clock": clock, "done": 100.0 + clock})
    out.append({"pid": 12, "rank": 2, "clock": 2, "begin": [50, 51]})
    out.append({"pid": 12, "rank": 2, "clock": 2, "done": 102.5})
    return out


def seen(final_from: dict[int, list[int]], versions: dict[str, int]) -> Seen:
    params = samples.reference(final_from, hidden=8)
    return Seen(
        status=0,
        markers=[
            {
                "spec": "worker:1:kill@2:after-reply",
                "role": "worker",
                "pid": 11,
                "step": 2,
                "phase": "after-reply",
                "at": 101.4,
            }
        ],
        records=records(),
        final={
            "clock": 3,
            "params": [p.flatten().tolist() for p in params],
            "versions": versions,
            "chunks": 6,
        },
    )


def test_equivalent_over_the_samples_processed_counting_an_after_reply_death() -> None:
    steps = samples.processed(records(), [(11, 2)])
    assert steps == {0: [0, 1], 1: [8, 9], 2: [16, 17, 50, 51]}
    verdict = judge(seen(steps, {str(c): 3 for c in range(6)}), steps=3, hidden=8)
    assert verdict["equivalent"] is True
    assert verdict["max_diff"] == 0.0
    assert verdict["lost_updates"] == 0
    assert verdict["completed"] is True
    assert verdict["faults_injected"] == 1
    assert verdict["recovery_s"] == [0.6]  # the kill at 101.4, the next step done at 102.0


def test_a_lost_update_or_a_sample_left_out_is_seen() -> None:
    steps = samples.processed(records(), [(11, 2)])
    versions = {str(c): 3 for c in range(6)}
    versions["4"] = 2  # one chunk missed an update
    del versions["5"]  # one chunk is held by no server
    verdict = judge(seen(steps, versions), steps=3, hidden=8)
    assert verdict["lost_updates"] == 1 + 3
    wrong = {**steps, 2: [16, 50, 51]}  # the job applied less than it logged
    verdict = judge(seen(wrong, {str(c): 3 for c in range(6)}), steps=3, hidden=8)
    assert verdict["equivalent"] is False
    assert verdict["max_diff"] > 1e-5


def test_a_job_that_ended_early_says_why() -> None:
    s = Seen(
        status=1,
        lines=["[worker 0] trimtab.errors.JobAborted: worker 1 has been silent for 30s"],
        markers=[
            {
                "spec": "worker:1:kill@2",
                "role": "worker",
                "pid": 11,
                "step": 2,
                "phase": "before-push",
                "at": 150.0,
            }
        ],
        records=records(),
    )
    verdict = judge(s, steps=3, hidden=8)
    assert verdict["equivalent"] is False
    assert verdict["lost_updates"] is None
    assert verdict["recovery_s"] == [None]  # no step completed after the kill
    assert "JobAborted" in verdict["reason"]


def test_soak_plans_are_seeded_and_keep_rank_0_and_a_server() -> None:
    a = plan(random.Random(3), 400, 3, 2)
    assert a == plan(random.Random(3), 400, 3, 2)
    faults, every = a
    specs = parse_faults(faults)
    assert 5 <= every <= 20
    assert len(specs) >= 5
    steps = sorted({sp.step for sp in specs if sp.count == 0})
    assert all(b - a >= 40 for a, b in itertools.pairwise(steps))  # a join is up
    assert all(s.index != 0 for s in specs if s.role == "worker")
    assert len({s.index for s in specs if s.role == "server"}) <= 2
    for s in specs:
        if s.role == "worker" and s.count == 0:
            assert f"worker:+1@{s.step + 2}" in faults  # each worker kill, a join after
    # Coordinator kills in some plans, numbered as the replacements come.
    kills = [
        [sp.index for sp in parse_faults(plan(random.Random(seed), 600, 3, 2)[0])
         if sp.role == "coordinator"]
        for seed in range(10)
    ]  # fmt: skip
    assert any(kills) and all(k == list(range(len(k))) for k in kills)
