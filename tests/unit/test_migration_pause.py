"""What keeps a migration from pausing the step (issue 20): a chunk whose table's round
is under way is cut after that round, pushed to yet or not, and the workers are sent
the published map (MAP_NEWS), adopted at their next step's first push."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_frontend_parts import _Clock, _Context
from tests.unit.test_server_handover import migrate, servers
from tests.unit.test_server_store import map_header, push, store_of
from trimtab.errors import ProtocolError
from trimtab.frontend.reports import StepReporter
from trimtab.protocol import headers as h
from trimtab.protocol.messages import Control
from trimtab.protocol.prefetch import map_news, read_map_news
from trimtab.roles.server.cuts import cut_of, rounds_under_way
from trimtab.roles.worker.context import JobTerms
from trimtab.roles.worker.news import MapNews

OK = {"o": int(Control.OK), "epoch": 1}


def test_a_chunk_not_yet_pushed_is_cut_after_its_tables_round_under_way() -> None:
    old, _ = servers()
    assert old.plan(migrate([1, 1])) == {"0": 0, "1": 0}  # no round under way: at it
    old, _ = servers()
    push(old.store, 0, [1, 1, 1, 1], chunk=0)  # worker 0's step 0 reached chunk 0 only
    # Chunk 1's push of round 0 is on its way: it is applied here, not answered moved.
    assert old.plan(migrate([1, 1])) == {"0": 1, "1": 1}
    assert old.ready(1) is None  # it goes once round 0 is answered
    push(old.store, 0, [1, 1, 1, 1], chunk=1)
    push(old.store, 1, [3, 3, 3, 3], chunk=1)
    assert old.ready(1) is not None


def test_a_round_under_way_in_one_table_cuts_nothing_later_in_another() -> None:
    # Two optimizers (a GAN's): table 1's chunk is pushed in another part of the step,
    # which may not come (its optimizer may step less often).
    opt = {"mode": "summation", "cls": "SGD", "groups": [{"lr": 0.5}]}
    header = map_header(
        [0, 0],
        tensors=[["w", [4], "float32", 0], ["v", [4], "float32", 0]],
        tables=[[1, opt], [1, opt]],
    )
    store = store_of(**{k: v for k, v in header.items() if k not in ("owners",)}, owners=[0, 0])
    push(store, 0, [1, 1, 1, 1], chunk=0)
    assert [store.table_of(store.chunks[c].spec) for c in (0, 1)] == [0, 1]
    under_way = rounds_under_way(store)
    assert under_way == {0: 0}
    assert cut_of(store.chunks[0], 0, under_way) == 1
    assert cut_of(store.chunks[1], 1, under_way) == 0


def test_map_news_carries_the_published_map_and_is_read_as_a_map() -> None:
    published = h.map_reply(
        rid=9, epoch=3, owners=[1, 0], servers=["a", "b"], prev=[0, 1], cuts={"0": 5}
    )
    news = map_news(published)
    assert news["o"] == Control.MAP_NEWS and news["i"] == 0 and published["i"] == 9
    assert read_map_news(dict(news)) == news
    with pytest.raises(ProtocolError):
        read_map_news({"o": int(Control.MAP_NEWS), "epoch": 3, "owners": [1, 0]})


def test_the_client_keeps_the_newest_news_once_and_drops_a_malformed_one() -> None:
    news = MapNews()
    for epoch in (3, 5, 4):
        news.keep(
            dict(map_news(h.map_reply(rid=0, epoch=epoch, owners=[], servers=[], prev=[], cuts={})))
        )
    news.keep({"o": int(Control.MAP_NEWS), "epoch": 9})  # malformed: dropped
    taken = news.take()
    assert taken is not None and taken["epoch"] == 5
    assert news.take() is None


def test_a_reporter_adopts_news_at_a_steps_first_push_only() -> None:
    clock = _Clock()
    ctx = _Context(JobTerms(), [dict(OK) for _ in range(3)])
    reporter = StepReporter(ctx, timer=clock, cpu_timer=clock, now=clock)  # type: ignore[arg-type]
    news: dict[str, Any] = {"epoch": 4}
    ctx.client.news = news
    reporter.before_push(False, 0)
    assert ctx.adopted == [] and ctx.client.news is news
    reporter.before_push(True, 1)
    assert ctx.adopted == [4] and ctx.client.news is None
