"""A server's cuts follow its table's round, not each chunk's own (issue 38: the bed cut
some of a server's leaving chunks at the round in progress and the rest after it).

Under BSP a step's pushes reach a server chunk after chunk: between one chunk's last
push (its round complete, nothing of the next in) and the next chunk's first, no chunk
of the table has a push in, yet the round is half done. A MIGRATE read then must cut
every chunk after that round, those not pushed yet too: their pushes are on their way.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_server_handover import migrate, servers
from tests.unit.test_server_store import map_header, push, store_of
from trimtab.errors import ChunkMoved
from trimtab.roles.server.cuts import rounds_under_way
from trimtab.roles.server.handover import Handover
from trimtab.runtime.credentials import SERVER, Credentials, credential, new_key


def test_a_round_completed_on_one_chunk_cuts_the_chunk_not_pushed_yet_after_it() -> None:
    old, _ = servers()
    push(old.store, 0, [1, 1, 1, 1], chunk=0)
    push(old.store, 1, [3, 3, 3, 3], chunk=0)  # chunk 0's round 0 complete; chunk 1 untouched
    assert old.store.chunks[0].round == 1 and not old.store.chunks[0].arrived
    assert not old.store.chunks[1].arrived
    # (Before issue 38's fix: {"0": 1, "1": 0}, and chunk 1's step-0 pushes were moved.)
    assert old.plan(migrate([1, 1])) == {"0": 1, "1": 1}
    push(old.store, 0, [1, 1, 1, 1], chunk=1)  # taken here, not answered moved
    assert old.ready(1) is None  # goes once round 0 is answered
    push(old.store, 1, [1, 1, 1, 1], chunk=1)
    message = old.ready(1)
    assert message is not None and message[1]["k"] == 1
    ready = old.ready(0)
    assert ready is not None and ready[1]["k"] == 1
    with pytest.raises(ChunkMoved):  # the next step's pushes are the new owner's
        push(old.store, 0, [1, 1, 1, 1], chunk=0, clock=1)


def test_a_chunk_that_came_by_handover_cuts_the_servers_own_after_its_round() -> None:
    # Server 0 owns chunk 0, server 1 chunk 1; chunk 0 moves to server 1 after round 0.
    header = map_header([0, 1])
    old, new = store_of(index=0, owners=[0, 1]), store_of(index=1, owners=[0, 1])
    key = new_key()
    pair = []
    for store in (old, new):
        creds = Credentials("job")
        creds.learn(key, 2, credential(key, "job", SERVER, store.index))
        pair.append(Handover(store, creds))
    a, b = pair
    assert header["owners"] == [0, 1]
    push(old, 0, [1, 1, 1, 1], chunk=0)
    assert a.plan(migrate([1, 1])) == {"0": 1} and b.plan(migrate([1, 1])) == {}
    push(old, 1, [3, 3, 3, 3], chunk=0)
    message = a.ready(0)
    assert message is not None
    b.arrive(message[1], [memoryview(bytes(f)) for f in message[2]], sender=0)
    # Server 1 now holds chunk 0 at round 1 (its round 0 done at server 0) and its own
    # chunk 1 at round 0, whose step-0 pushes are on their way.
    assert (new.chunks[0].round, new.chunks[1].round) == (1, 0)
    assert rounds_under_way(new) == {0: 0}
    back: dict[str, Any] = {**map_header([0, 0]), "epoch": 3}
    assert b.plan(back) == {"0": 1, "1": 1}  # (before: {"0": 1, "1": 0})


def test_a_table_at_one_round_with_nothing_in_is_cut_at_it() -> None:
    old, _ = servers()
    for chunk in (0, 1):  # step 0 complete on both: step 1 not begun here
        push(old.store, 0, [1, 1, 1, 1], chunk=chunk)
        push(old.store, 1, [1, 1, 1, 1], chunk=chunk)
    assert rounds_under_way(old.store) == {0: 0}
    assert old.plan(migrate([1, 1])) == {"0": 1, "1": 1}  # at round 1, the one in progress
    assert old.ready(0) is not None and old.ready(1) is not None


def test_asynchronous_rounds_count_only_pushes_in() -> None:
    store = store_of(owners=[0, 0], consistency="asp")
    push(store, 0, [1, 1, 1, 1], chunk=0)  # ASP: a round a push
    assert store.chunks[0].round == 1 and rounds_under_way(store) == {}
