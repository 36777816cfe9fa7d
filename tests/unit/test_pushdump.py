"""A pusher's part of a hung job's dump: each request not answered, and the last one
waited for."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace
from typing import Any

from trimtab.errors import ChunkMoved
from trimtab.frontend.pushdump import unanswered


def test_the_dump_names_each_request_not_answered_and_the_last_waited_for() -> None:
    waiting: concurrent.futures.Future[Any] = concurrent.futures.Future()
    moved: concurrent.futures.Future[Any] = concurrent.futures.Future()
    moved.set_exception(ChunkMoved(4, 1, 2))
    answered: concurrent.futures.Future[Any] = concurrent.futures.Future()
    answered.set_result(None)
    sent = [(waiting, {"c": 3, "i": 9}, [], 0), (moved, {"c": 4, "i": 10}, [], 1)]
    sent.append((answered, {"c": 5, "i": 11}, [], 1))
    ctx: Any = SimpleNamespace(placement=object(), server_of=lambda c, k: f"tcp://s{c}:{k}")
    text = unanswered({"p": sent}, {"p": (sent, 7)}, (3, 9, 7), ctx)
    assert text.splitlines() == [
        "1 tensors pushed this step, 1 awaiting values",
        "  last waited for: chunk 3, request 9, at tcp://s3:7",
        "  unanswered: chunk 3 (clock 7, request 9) sent to server 0",
        "  unanswered: chunk 4 (clock 7, request 10) sent to server 1 [ChunkMoved]",
    ]
