"""The growing-table policy (policies/growth.py): admission after N sightings, by
probability, eviction by time to live and under the cap, and its state's round trip.
Pure: steps are passed in, no clock, no sockets."""

from __future__ import annotations

import pytest

from trimtab.errors import ConfigError
from trimtab.policies.growth import Growth, RowMap, admits, caps

BIG = 1 << 62


def test_an_id_gets_a_row_on_its_nth_sighting_and_reads_before_are_refused() -> None:
    m = RowMap(Growth(admit_after=3), range(10, 14), cap=4)
    assert m.see([BIG, -5], step=0) == ([-1, -1], [])
    assert m.see([BIG], step=1) == ([-1], [])
    rows, fresh = m.see([-5, BIG], step=2)  # BIG's third sighting; -5's second
    assert rows == [-1, 10] and fresh == [10]
    assert m.see([BIG], step=3) == ([10], [])  # admitted: the same row, not fresh
    assert m.counters() == {
        "admitted": 1, "refused": 4, "evicted": 0, "evicted_for_cap": 0, "full": 0, "live": 1,
    }  # fmt: skip


def test_rows_unseen_past_the_time_to_live_are_given_back_and_come_back_fresh() -> None:
    m = RowMap(Growth(ttl_steps=2), range(4), cap=4)
    assert m.see([7, 8], step=0) == ([0, 1], [0, 1])
    m.see([8], step=2)
    assert m.see([9], step=3) == ([0], [0])  # 7 unseen for 3 > 2 steps: its row reused
    assert m.counters()["evicted"] == 1 and m.live == 2
    rows, fresh = m.see([7], step=3)  # 7 again: a new row, started afresh
    assert rows == fresh == [2]
    assert m.expire(6) == [1, 0, 2]  # all unseen for more than 2 steps, oldest first
    assert m.live == 0 and m.counters()["evicted"] == 4


def test_the_cap_evicts_the_least_recently_seen_row_but_never_one_seen_this_step() -> None:
    m = RowMap(Growth(), range(100), cap=2)
    m.see([1, 2], step=0)
    m.see([1], step=1)
    assert m.see([3], step=2) == ([1], [1])  # 2 was seen least recently: its row goes
    assert m.counters()["evicted_for_cap"] == 1 and m.live == 2
    # At step 3, both live rows are seen first: a new id finds no row to take.
    assert m.see([1, 3, 4], step=3) == ([0, 1, -1], [])
    assert m.counters()["full"] == 1 and m.counters()["refused"] == 1
    assert m.see([4], step=4) == ([0], [0])  # room again (1 is the oldest now)


def test_probability_admission_is_a_pure_function_of_the_id_and_sighting() -> None:
    g = Growth(admit_prob=0.25, seed=3)
    decisions = [admits(g, k, 1) for k in range(4000)]
    assert decisions == [admits(g, k, 1) for k in range(4000)]
    assert 800 < sum(decisions) < 1200
    m = RowMap(g, range(10_000), cap=10_000)
    for step in range(20):
        m.see(list(range(200)), step)
    assert m.live > 190  # each sighting tries again: nearly all admitted by now


def test_the_map_survives_export_and_restore() -> None:
    g = Growth(admit_after=2, ttl_steps=5)
    m = RowMap(g, range(8, 16), cap=6)
    for step, keys in enumerate([[1, 2, 3], [2, 3, 4], [3, 9], [BIG, -BIG]]):
        m.see(keys, step)
    back = RowMap.restore(g, range(8, 16), 6, m.export())
    assert back.export() == m.export()
    assert back.see([9, 1, 50], 4) == m.see([9, 1, 50], 4)
    with pytest.raises(ValueError, match="outside its bucket"):
        RowMap.restore(g, range(0, 2), 6, m.export())


def test_caps_share_max_rows_in_proportion_and_sum_to_it() -> None:
    assert caps(0, [5, 7]) == [5, 7]
    assert caps(100, [5, 7]) == [5, 7]
    shares = caps(10, [7, 7, 7])
    assert sum(shares) == 10 and max(shares) - min(shares) <= 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"admit_after": 0}, "admit_after must be at least 1"),
        ({"admit_prob": 0.0}, r"admit_prob must be in \(0, 1\]"),
        ({"admit_prob": 1.5}, r"admit_prob must be in \(0, 1\]"),
        ({"ttl_steps": -1}, "ttl_steps must be >= 0"),
        ({"max_rows": -3}, "max_rows must be >= 0"),
        ({"admit_after": 2.0}, "admit_after must be an int"),
    ],
)
def test_bad_settings_are_refused_saying_what_to_do(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Growth(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"growing": {"admit_after": 2}}, "growing must be a trimtab.nn.Growth"),
        ({"growing": Growth(max_rows=200)}, r"max_rows \(200\) exceeds the table's 100 rows"),
        ({"growing": Growth(), "hot_rows": 10}, "cannot replicate hot rows"),
        ({"growing": Growth(), "padding_idx": 0}, "no padding row"),
    ],
)
def test_a_growing_table_with_bad_settings_is_refused(kwargs: dict, match: str) -> None:
    import trimtab.nn

    with pytest.raises(ConfigError, match=match):
        trimtab.nn.EmbeddingBag(100, 4, **kwargs)
