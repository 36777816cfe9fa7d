"""A migration's *moved* answers are resent together (issue 20's migration pause): once
the map is refreshed, every push of the step already answered *moved* goes to its new
owner at once, not one at a time after the previous one's value."""

from __future__ import annotations

import concurrent.futures
import types
from typing import Any, cast

import torch

from trimtab.errors import ChunkMoved
from trimtab.frontend.pusher import Pusher, Sent
from trimtab.roles.worker.replies import Reply


def _done(result: Reply | Exception | None) -> concurrent.futures.Future[Reply]:
    f: concurrent.futures.Future[Reply] = concurrent.futures.Future()
    if isinstance(result, Exception):
        f.set_exception(result)
    elif result is not None:
        f.set_result(result)
    return f


def _sent(cid: int, result: Reply | Exception | None, owner: int = 0) -> Sent:
    return (_done(result), cast(Any, {"o": 65, "c": cid, "e": 2, "k": 7}), [], owner)


def test_pushes_answered_moved_are_resent_at_once_and_only_those() -> None:
    requests: list[tuple[str, int, int]] = []

    def request(address: str, header: dict[str, Any], frames: list[Any]) -> Any:
        requests.append((address, header["c"], header["e"]))
        return _done(None)

    client = types.SimpleNamespace(request=request)
    ctx = types.SimpleNamespace(
        client=client,
        placement=types.SimpleNamespace(epoch=3),
        server_of=lambda cid, clock: f"new-owner-of-{cid}@{clock}",
    )
    pusher = Pusher(
        cast(Any, ctx), {}, cast(Any, None), summation=False, slots=cast(Any, None), timed=False
    )
    value = Reply({"o": 67}, [])
    futs = [
        _sent(0, ChunkMoved(0, 1, 3)),  # answered before: its tuple keeps the first future
        _sent(1, ChunkMoved(1, 1, 3)),  # the one _await resends itself
        _sent(2, ChunkMoved(2, 1, 3)),  # resent here
        _sent(3, None),  # no answer yet: it may well be applied where it was sent
        _sent(4, value),  # answered with a value
        _sent(5, ChunkMoved(5, 1, 4)),  # moved by a map newer than ours: left to _await
    ]
    other = [_sent(6, ChunkMoved(6, 0, 3), owner=1)]  # another parameter's, same step
    pusher._current = (futs, 7)
    pusher.arriving[torch.zeros(1)] = (other, 7)
    kept = list(futs)

    pusher._resend_moved(kept[1][1])

    assert sorted(requests) == [("new-owner-of-2@7", 2, 3), ("new-owner-of-6@7", 6, 3)]
    for i in (0, 1, 3, 4, 5):
        assert futs[i] is kept[i]
    assert futs[2][0] is not kept[2][0] and futs[2][3] == -1  # no server's traffic
    assert other[0][0].done() is False and other[0][3] == -1
