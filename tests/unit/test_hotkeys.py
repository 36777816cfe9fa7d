"""The hot-key policy (NuPS's top-N by access count, with hysteresis), pure."""

from __future__ import annotations

import pytest

from trimtab.policies.hotkeys import HotKeys, choose_hot, hit_rate


def test_the_top_n_by_count_are_hot() -> None:
    counts = [(5, 10.0), (1, 50.0), (9, 30.0), (2, 1.0)]
    assert choose_hot(counts, [], HotKeys(size=2)) == [1, 9]
    assert choose_hot(counts, [], HotKeys(size=0)) == []
    assert choose_hot([(3, 0.0)], [], HotKeys(size=2)) == []  # never read: never hot


def test_rows_read_too_rarely_are_never_hot() -> None:
    """Uniform access: no row reaches the floor, the set stays empty (nothing to pay)."""
    settings = HotKeys(size=10, refresh_steps=10, decay=0.5, min_rate=0.1)
    assert settings.floor == 2.0  # 0.1 a forward, 10 forwards a window, 2 windows' worth
    rare = [(r, 0.4) for r in range(100)]
    assert choose_hot(rare, [], settings) == []
    assert choose_hot([(1, 1.8), (2, 5.0)], [1], settings) == [1, 2]  # 1.8 x 1.2 >= 2


def test_a_held_row_stays_unless_beaten_by_the_margin() -> None:
    settings = HotKeys(size=1, margin=1.5)
    assert choose_hot([(1, 10.0), (2, 14.0)], [1], settings) == [1]  # 14 < 1.5 x 10
    assert choose_hot([(1, 10.0), (2, 16.0)], [1], settings) == [2]
    assert choose_hot([(2, 16.0), (1, 4.0)], [1], HotKeys(size=2)) == [1, 2]  # room for both
    assert choose_hot([(2, 16.0)], [1], HotKeys(size=2)) == [2]  # 1 is read no more


def test_settings_are_checked_and_the_hit_rate_is_a_share() -> None:
    with pytest.raises(ValueError, match="refresh_steps"):
        HotKeys(size=1, refresh_steps=0)
    with pytest.raises(ValueError, match="decay"):
        HotKeys(size=1, decay=0)
    assert hit_rate(0, 0) == 0.0
    assert hit_rate(3, 4) == 0.75
