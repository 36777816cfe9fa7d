"""A worker that said it was done registers again under its rank (``trimtab.init()``
after ``trimtab.shutdown()``) while the job still runs: the coordinator's membership
without sockets, and a worker's new context in a cluster of one process."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.unit.test_coordinator_members import code_of, job
from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Control
from trimtab.roles.coordinator.members import MemberState


def again(rank: int) -> dict[str, Any]:
    return {"o": int(Control.REGISTER), "i": 1, "role": "worker", "rank": rank}


def test_a_done_worker_takes_its_rank_again_and_the_job_waits_for_it() -> None:
    members = job()
    w0 = members.workers[0]
    w0.floor = 3
    with pytest.raises(ProtocolError, match="rank 0 is taken") as taken:
        members.register(b"new", again(0), running=True)  # still active
    assert code_of(taken) == "bad_state"
    assert not members.worker_done(w0)
    back = members.register(b"new", again(0), running=True)
    assert back.rank == 0 and back.state is MemberState.ACTIVE and back.floor == 3
    assert members.workers[0] is back and members.by_peer[b"new"] is back
    assert b"w0" not in members.by_peer  # the old connection is no member any more
    assert not members.worker_done(members.workers[1])  # worker 0 is back: not over
    assert members.worker_done(back)
    # A rank not given (-1) never takes a done worker's: that needs the rank named.
    with pytest.raises(ProtocolError, match="no worker rank free"):
        members.register(b"auto", {"o": 1, "i": 1, "role": "worker", "rank": -1}, running=True)


def test_a_worker_context_closed_and_made_again_rejoins_the_running_job(
    cluster_factory: Any,
) -> None:
    cluster = cluster_factory(workers=2, servers=1)
    cluster.context(0).close()  # shutdown(): worker 0 said it is done
    released: list[int] = []

    def worker1() -> None:
        ctx1 = cluster.context(1)  # the job goes on for this one
        try:
            ctx1.barrier("after")  # released only once worker 0 is back in it
            released.append(1)
        finally:
            ctx1.close()

    t = threading.Thread(target=worker1)
    t.start()
    back = cluster.context(0)  # init() after shutdown(): registers under rank 0 again
    assert back.rank == 0
    back.barrier("after")
    t.join(30)
    assert released == [1]
    assert cluster.coordinator.status()["done"] == [1]  # worker 0 is active again
    back.close()
