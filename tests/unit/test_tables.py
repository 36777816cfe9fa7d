"""Several DistributedOptimizers per job, without threads or sockets: each declaration
is a table whose chunks take the next ids under a new map epoch (the coordinator's
:class:`Maps`, with migrations kept apart), the headers that carry the tables, the
server's store building each chunk's optimizer from its table's ``opt`` (fresh on
EXTEND, and on a handover), and the worker's view of its table's chunks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.gan_job import GanSetup, train_worker
from tests.gan_job import max_difference as gan_difference
from tests.gan_job import reference as gan_reference
from tests.unit.test_coordinator_migration import TERMS, ops, rebalancer, register
from trimtab.core.chunks import ChunkSpec, TensorSpec
from trimtab.errors import ProtocolError, UsageError
from trimtab.policies.placement import PLACEMENTS
from trimtab.policies.psld import PsldController
from trimtab.protocol import headers as h
from trimtab.protocol.messages import Control, ErrorCode, decode, encode
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Members, MemberState
from trimtab.roles.coordinator.outbox import Outbox, Refuse
from trimtab.roles.server.handover import Handover
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.optim import OptimizerMode
from trimtab.roles.server.slots import SharedArenas
from trimtab.roles.server.store import ChunkStore
from trimtab.roles.worker.context import Table
from trimtab.runtime.credentials import SERVER, Credentials, credential, new_key

GEN = [["g.w", [64], "float32", 0], ["g.b", [16], "float32", 0]]  # 256 + 64 bytes
DISC = [["d.w", [32], "float32", 0], ["d.b", [8], "float32", 1]]  # 128 + 32 bytes
ADAM = {"mode": "server", "cls": "Adam", "groups": [{"lr": 0.01, "betas": [0.5, 0.999]}]}
SGD = {"mode": "server", "cls": "SGD", "groups": [{"lr": 0.1}, {"lr": 0.2, "momentum": 0.9}]}


def declare(
    maps: Maps,
    members: Members,
    rank: int,
    tensors: list[Any],
    opt: dict[str, Any],
    table: int,
    *,
    migrating: bool = False,
) -> Outbox:
    header = {**h.declare(tensors=tensors, opt=opt, table=table), "i": 10 * (table + 1) + rank}
    maps.declare(members.workers[rank], header)
    return maps.place(members, migrating=migrating)


def two_tables(servers: int = 2) -> tuple[Members, Maps, Outbox]:
    """A job whose first table (GEN under Adam) is placed and released; every worker
    declared the second (DISC under SGD). Returns the EXTENDs."""
    members = Members(2, servers, servers)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    for w in range(2):
        declare(maps, members, w, GEN, ADAM, 0)
    for s in range(servers):
        maps.ack(s, members)
    assert declare(maps, members, 0, DISC, SGD, 1) == []  # waits for worker 1
    return members, maps, declare(maps, members, 1, DISC, SGD, 1)


# -- the coordinator -------------------------------------------------------------------


def test_a_second_table_takes_the_next_chunk_ids_under_a_new_epoch() -> None:
    members, maps, out = two_tables()
    assert ops(out) == [(b"s0", Control.EXTEND), (b"s1", Control.EXTEND)]
    extend = out[0].header
    assert extend["epoch"] == 2 and extend["i"] == 0
    assert extend["tensors"] == GEN + DISC  # every table's, in declaration order
    assert extend["opt"] == ADAM and extend["tables"] == [[2, ADAM], [2, SGD]]
    # GEN: chunks 0, 1 (128 bytes each) and 2; DISC: 3 (128) and 4 (32), placed greedily.
    assert extend["owners"] == [0, 1, 0, 0, 1]
    assert maps.sizes == [128, 128, 64, 128, 32] and maps.epoch == 2
    assert maps.pending and [t for t, _ in maps.tables] == [GEN, DISC]
    # The workers get the map once every server holds its new chunks.
    assert maps.ack(1, members) == []
    released = maps.ack(0, members)
    assert [(m.peer, m.header["i"], m.header["o"]) for m in released] == [
        (b"w0", 20, Control.MAP),
        (b"w1", 21, Control.MAP),
    ]
    assert released[0].header["owners"] == [0, 1, 0, 0, 1]
    assert all(w.floor == 2 for w in members.workers.values())
    assert not maps.pending
    # A MIGRATE names every table too: a server that joins later learns both.
    assert maps.header is not None and maps.header["tables"] == [[2, ADAM], [2, SGD]]


def test_one_table_keeps_the_map_header_of_before() -> None:
    members = Members(1, 1, 1)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    out = declare(maps, members, 0, GEN, ADAM, 0)
    assert ops(out) == [(b"s0", Control.MAP)] and "tables" not in out[0].header


def test_tables_declared_out_of_order_or_twice_are_refused() -> None:
    members = Members(2, 1, 1)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    with pytest.raises(ProtocolError, match="same order") as early:
        declare(maps, members, 0, DISC, SGD, 1)  # no table 0 yet
    assert early.value.args[0] == ErrorCode.BAD_STATE.value
    for w in range(2):
        declare(maps, members, w, GEN, ADAM, 0)
    maps.ack(0, members)
    with pytest.raises(ProtocolError, match="optimizer number 0"):
        declare(maps, members, 1, GEN, ADAM, 0)  # table 0 again (the old refusal's case)


def test_workers_declaring_a_different_second_table_are_all_refused() -> None:
    members = Members(2, 1, 1)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    for w in range(2):
        declare(maps, members, w, GEN, ADAM, 0)
    maps.ack(0, members)
    declare(maps, members, 0, DISC, SGD, 1)
    out = declare(maps, members, 1, DISC[:1], SGD, 1)
    assert [(m.peer, m.rid, m.code) for m in out if isinstance(m, Refuse)] == [
        (b"w0", 20, "mismatch"),
        (b"w1", 21, "mismatch"),
    ]
    assert maps.epoch == 1 and len(maps.tables) == 1  # nothing placed: they may retry
    declare(maps, members, 0, DISC, SGD, 1)
    assert ops(declare(maps, members, 1, DISC, SGD, 1)) == [(b"s0", Control.EXTEND)]


def test_a_table_waits_for_the_migration_in_flight_and_blocks_the_next() -> None:
    members = Members(2, 2, 2)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    for w in range(2):
        declare(maps, members, w, GEN, ADAM, 0)
    for s in range(2):
        maps.ack(s, members)
    reb = rebalancer(members, maps, rotate_every=1)
    out: Outbox = []
    reb.step_boundary(1, out)
    assert reb.migrating is not None
    # Every worker declares the second table during the migration: it waits.
    for w in range(2):
        header = {**h.declare(tensors=DISC, opt=SGD, table=1), "i": 20 + w}
        maps.declare(members.workers[w], header)
        assert reb.place() == []
    assert len(maps.tables) == 1 and maps.epoch == 1
    out = []
    reb.on_ack(0, {"o": 19, "epoch": 2, "cuts": {"0": 1}}, out)
    reb.on_ack(1, {"o": 19, "epoch": 2, "cuts": {"1": 1, "2": 1}}, out)
    assert maps.epoch == 2  # the migration's map, published
    out = []
    reb.on_handed({"o": 20, "c": [0, 1, 2]}, out)  # done: the table goes now
    assert reb.migrating is None
    assert ops(out) == [(b"s0", Control.EXTEND), (b"s1", Control.EXTEND)]
    assert out[0].header["epoch"] == 3 and len(out[0].header["owners"]) == 5
    # The published map (MAP_GET's answer) covers the new chunks, old cuts kept.
    assert maps.published is not None and maps.published["epoch"] == 3
    assert len(maps.published["owners"]) == 5 and len(maps.published["prev"]) == 5
    assert maps.published["cuts"] == {"0": 1, "1": 1, "2": 1}
    # While the servers create the new chunks, nothing migrates.
    assert maps.pending
    out = []
    reb.step_boundary(5, out)
    assert reb.migrating is None and out == []
    with pytest.raises(UsageError, match="being placed"):
        reb.migrate((0, 0, 0, 0, 0), out)
    maps.ack(0, members)
    maps.ack(1, members)
    reb.step_boundary(6, out)
    assert reb.migrating is not None and len(reb.migrating.owners) == 5


def test_a_new_table_goes_to_active_servers_only_and_drops_a_psld_trial() -> None:
    members = Members(2, 2, 2)
    register(members)
    maps = Maps(PLACEMENTS.create("greedy"), 128, dict(TERMS))
    for w in range(2):
        declare(maps, members, w, GEN, ADAM, 0)
    for s in range(2):
        maps.ack(s, members)
    members.drain(members.servers[1])
    reb = rebalancer(members, maps)
    psld = reb.psld = PsldController()
    psld._trial = object()  # type: ignore[assignment]  # a trial over three chunks
    for w in range(2):
        maps.declare(members.workers[w], {**h.declare(tensors=DISC, opt=SGD, table=1), "i": 20 + w})
    out = reb.place()
    assert out[0].header["owners"][3:] == [0, 0]  # not to the draining server
    assert ops(out) == [(b"s0", Control.EXTEND), (b"s1", Control.EXTEND)]  # both learn it
    assert not psld.trial_running
    assert members.servers[1].state is MemberState.DRAINING


# -- the wire --------------------------------------------------------------------------


def test_declare_carries_its_table_from_the_second_on() -> None:
    assert h.declare(tensors=GEN, opt=ADAM) == {
        "o": int(Control.DECLARE),
        "tensors": GEN,
        "opt": ADAM,
    }
    assert h.declare(tensors=GEN, opt=ADAM, table=2)["t"] == 2
    with pytest.raises(ProtocolError):
        h.read_declare({"o": 4, "i": 1, "tensors": GEN, "opt": ADAM, "t": "1"})


def job_map(**more: Any) -> h.JobMapHeader:
    return h.job_map(
        epoch=2,
        tensors=GEN + DISC,
        chunk_bytes=128,
        owners=[0, 1, 0, 0, 1],
        servers=["inproc://s0", "inproc://s1"],
        opt=ADAM,
        workers=[0, 1],
        batching="equal",
        consistency="bsp",
        report_s=0.0,
        time_servers=False,
        consistency_args={},
        **more,
    )


def test_tables_are_read_with_their_counts_checked() -> None:
    one = job_map()
    assert "tables" not in one and h.read_tables(one) == [(4, ADAM)]
    two = job_map(tables=[[2, ADAM], [2, SGD]])
    assert h.read_tables(h.read_job_map(two)) == [(2, ADAM), (2, SGD)]
    extend = h.extend(job_map=two)
    assert extend["o"] == Control.EXTEND and extend["i"] == 0 and "i" not in two
    assert h.read_extend(extend)["tables"] == two["tables"]
    assert decode(encode({**extend, "j": "job"}), "job")["tables"] == [[2, ADAM], [2, SGD]]
    for bad in ([[3, ADAM], [2, SGD]], [[2, ADAM], [2]], [["2", ADAM], [2, SGD]]):
        with pytest.raises(ProtocolError) as info:
            h.read_tables(job_map(tables=bad))
        assert info.value.args[0] == ErrorCode.MALFORMED.value


# -- the server ------------------------------------------------------------------------


def store(index: int, header: h.JobMapHeader) -> ChunkStore:
    s = ChunkStore(LoadMeter(), SharedArenas("job"))
    s.index = index
    s.apply_map(header)
    return s


def first_map() -> h.JobMapHeader:
    return h.job_map(
        epoch=1,
        tensors=GEN,
        chunk_bytes=128,
        owners=[0, 1, 0],
        servers=["inproc://s0", "inproc://s1"],
        opt=ADAM,
        workers=[0, 1],
        batching="equal",
        consistency="bsp",
        report_s=0.0,
        time_servers=False,
        consistency_args={},
    )


def test_extend_makes_the_new_tables_chunks_under_their_own_optimizer() -> None:
    server = store(0, first_map())
    kept = server.chunks[0]
    kept.value.fill_(3.0)
    added = server.extend(h.read_extend(h.extend(job_map=job_map(tables=[[2, ADAM], [2, SGD]]))))
    assert added == [3] and sorted(server.chunks) == [0, 2, 3]
    assert server.chunks[0] is kept and float(kept.value[0]) == 3.0  # untouched
    assert server.epoch == 2 and server.owners == (0, 1, 0, 0, 1)
    adam, sgd = server.chunks[0].optimizer, server.chunks[3].optimizer
    assert adam is not None and type(adam.optimizer) is torch.optim.Adam
    assert sgd is not None and type(sgd.optimizer) is torch.optim.SGD
    assert sgd.optimizer.param_groups[0]["lr"] == 0.1  # d.w is in SGD's group 0
    other = store(1, first_map())
    assert other.extend(h.read_extend(h.extend(job_map=job_map(tables=[[2, ADAM], [2, SGD]])))) == [
        4
    ]
    group1 = other.chunks[4].optimizer
    assert group1 is not None and group1.optimizer.param_groups[0]["momentum"] == 0.9


def test_a_table_in_summation_mode_gets_no_server_optimizer() -> None:
    summed = {**SGD, "mode": "summation"}
    server = store(0, job_map(tables=[[2, ADAM], [2, summed]]))
    assert server.chunks[0].optimizer is not None and server.chunks[3].optimizer is None
    assert server.mode is OptimizerMode.SERVER  # (table 0's: what the log line says)


def test_a_bad_table_in_extend_changes_nothing() -> None:
    server = store(0, first_map())
    bad = job_map(tables=[[2, ADAM], [2, {**SGD, "mode": "nowhere"}]])
    with pytest.raises(ProtocolError, match="mode"):
        server.extend(bad)
    assert server.epoch == 1 and len(server.specs) == 3 and sorted(server.chunks) == [0, 2]


def test_a_chunk_handed_over_keeps_its_tables_optimizer_and_state() -> None:
    two = job_map(tables=[[2, ADAM], [2, SGD]])
    old, new = store(0, two), store(1, two)
    chunk = old.chunks[3]
    assert chunk.optimizer is not None
    chunk.optimizer.step(torch.ones(32))  # SGD with no momentum: no state; value moves
    migrate = h.read_migrate(
        h.migrate(job_map=two, epoch=3, owners=[0, 1, 0, 1, 1], servers=list(two["servers"]))
    )
    key = new_key()
    handovers = []
    for server in (old, new):
        creds = Credentials("job")
        creds.learn(key, 2, credential(key, "job", SERVER, server.index))
        handovers.append(Handover(server, creds))
    leaving, arriving = handovers
    assert leaving.plan(migrate) == {"3": 0}
    arriving.plan(migrate)
    message = leaving.ready(3)
    assert message is not None
    _, header, frames = message
    encoded = {**header, "j": "job"}
    arriving.arrive(encoded, [memoryview(bytes(f)) for f in frames], sender=0)
    moved = new.chunks[3]
    assert moved.optimizer is not None and type(moved.optimizer.optimizer) is torch.optim.SGD
    assert torch.equal(moved.value, torch.full((32,), -0.1))


# -- the worker ------------------------------------------------------------------------


def test_a_table_groups_its_chunks_by_its_own_tensors() -> None:
    tensors = (TensorSpec("d.w", (32,), "float32"), TensorSpec("d.b", (8,), "float32"))
    chunks = (
        ChunkSpec(3, 2, 0, 0, 16, "float32"),
        ChunkSpec(4, 2, 1, 16, 16, "float32"),
        ChunkSpec(5, 3, 0, 0, 8, "float32"),
    )
    table = Table(1, 2, tensors, chunks)
    assert table.chunks_by_tensor() == [list(chunks[:2]), [chunks[2]]]


# -- all roles in one process ----------------------------------------------------------

GAN_CASES = [
    (GanSetup("adam", "sgd", (10, 14)), 0),
    (GanSetup("adam", "rmsprop-sum", (5, 19)), 0),  # one table in summation mode
    (GanSetup("sgd", "adam", (7, 17)), 1),  # chunks of both tables move every step
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("setup", "rotate"),
    GAN_CASES,
    ids=[f"{s.gen}-{s.disc}{'-moving' if r else ''}" for s, r in GAN_CASES],
)
def test_two_optimizers_stepped_alternately_match_one_process(
    cluster_factory: Any, setup: GanSetup, rotate: int
) -> None:
    cluster = cluster_factory(
        workers=setup.workers, servers=2, chunk_bytes=128, rebalance_every=rotate
    )
    results = cluster.run_workers(lambda ctx: train_worker(setup, ctx.rank, ctx))
    expected = gan_reference(setup)
    for got in results:
        assert gan_difference(got, expected) < 1e-5
    assert (cluster.coordinator.migrations > 0) == bool(rotate)
