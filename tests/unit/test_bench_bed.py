"""The benchmarks' test-bed options, where no bed is made: the settings they would use
and the clear refusals (the runs themselves need root: BENCHMARKS.md has their figures)."""

from __future__ import annotations

import pytest

import trimtab_tools.bench.bed as bench_bed
import trimtab_tools.experiments.psld_bed as psld_bed


def test_psld_on_a_bed_refuses_a_scenario_whose_slow_server_moves() -> None:
    with pytest.raises(RuntimeError, match="moving"), psld_bed.shaped_bed("moving", 4, 2, 80e6, 4):
        pass


class _Bed:
    """A Testbed's shape(), recorded."""

    def __init__(self, hosts: int) -> None:
        self.hosts = list(range(hosts))
        self.shaped: dict[int, float] = {}

    def __enter__(self) -> _Bed:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def shape(self, host: int, rate_mbit: float = 0.0) -> None:
        self.shaped[host] = rate_mbit


def test_psld_bed_shapes_the_servers_links_and_the_slow_one_slower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[_Bed] = []
    monkeypatch.setattr(psld_bed, "unavailable", lambda: None)
    monkeypatch.setattr(psld_bed, "Testbed", lambda n: made.append(_Bed(n)) or made[-1])
    with psld_bed.shaped_bed("bandwidth", 4, 2, 80e6, 4) as bed:
        assert len(bed.hosts) == 7
    # 80 MB/s = 640 Mbit/s; server 3 at a quarter; host 4, the spare server's, at the
    # link's rate; the workers' hosts (5, 6) unshaped.
    assert made[0].shaped == {0: 640.0, 1: 640.0, 2: 640.0, psld_bed.SLOW_HOST: 160.0, 4: 640.0}
    with psld_bed.shaped_bed("skew", 4, 2, 80e6, 4):
        pass
    assert made[1].shaped == dict.fromkeys(range(5), 640.0)


def test_psld_on_a_bed_starts_an_added_server_on_the_spare_host() -> None:
    """psld's scale-out: the fifth server (index 4) goes to the spare host, shaped as the
    others, never onto a worker's host; the workers on the hosts after it."""
    bed = _Bed(7)
    where = psld_bed.layout(bed, 4)  # type: ignore[arg-type]
    assert [where.server(i) for i in range(5)] == [0, 1, 2, 3, 4]
    assert where.coordinator == 0
    assert [where.worker(r) for r in range(2)] == [5, 6]


def test_a_bed_where_none_can_be_made_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bench_bed, "unavailable", lambda: "needs root or CAP_NET_ADMIN")
    with pytest.raises(RuntimeError, match="CAP_NET_ADMIN"), bench_bed.shaped_bed(4, None):
        pass
    monkeypatch.setattr(psld_bed, "unavailable", lambda: "needs root or CAP_NET_ADMIN")
    with (
        pytest.raises(RuntimeError, match="CAP_NET_ADMIN"),
        psld_bed.shaped_bed("bandwidth", 4, 2, 80e6, 4),
    ):
        pass
