"""Typed headers: every builder sends the bytes today's dict literal sends, and every
reader refuses a missing or mistyped key as MALFORMED.

The reference of each builder is the literal copied from the role that builds it today
(at 1fbd39f), with the keys that role adds afterwards (``i`` by WorkerClient.request,
``j`` by NodeLoop.send, ``dt``/``z``/``sm``/``b`` by the optimizer and the server) added
in the same order, so that the comparison is of what goes on the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trimtab import ProtocolError
from trimtab.protocol import batch, rejoin, replica
from trimtab.protocol import headers as h
from trimtab.protocol.elastic import builders as elastic_builders
from trimtab.protocol.messages import (
    Control,
    Data,
    ErrorCode,
    decode,
    encode,
    error_header,
    error_of,
    inline,
    read_error,
)
from trimtab.protocol.prefetch import map_news

JOB = "job1"


def sent(header: Any) -> Any:
    """As NodeLoop.send does before encoding."""
    header["j"] = JOB
    return header


def requested(header: Any, rid: int = 7) -> Any:
    """As WorkerClient.request does before encoding."""
    header["i"] = rid
    header["j"] = JOB
    return header


def same(built: Any, literal: dict[str, Any]) -> None:
    assert list(built) == list(literal)
    assert encode(built) == encode(literal)


# -- control plane: membership, teardown, tools, barriers, broadcast -------------------


def test_membership_headers_are_today_s_bytes() -> None:
    addr = "tcp://127.0.0.1:5555"
    same(
        sent(h.register_server(rid=1, addr=addr)),
        sent({"o": int(Control.REGISTER), "i": 1, "role": "server", "addr": addr}),
    )
    same(
        requested(h.register_worker(rank=-1)),
        requested({"o": int(Control.REGISTER), "role": "worker", "rank": -1}),
    )
    same(
        sent(
            h.registered(
                rid=3, rank=1, num_workers=2, num_servers=2, chunk_bytes=1 << 20, heartbeat_s=1.0
            )
        ),
        sent(
            {
                "o": int(Control.REGISTERED),
                "i": 3,
                "rank": 1,
                "num_workers": 2,
                "num_servers": 2,
                "chunk_bytes": 1 << 20,
                "heartbeat_s": 1.0,
            }
        ),
    )
    same(sent(h.heartbeat()), sent({"o": int(Control.HEARTBEAT), "i": 0}))
    beat = {**{"o": int(Control.HEARTBEAT), "i": 0}, "j": JOB}
    same(h.worker_heartbeat(job=JOB, floor=None), beat)
    beat["lo"] = 4
    same(h.worker_heartbeat(job=JOB, floor=4), beat)
    same(requested(h.done()), requested({"o": int(Control.DONE)}))
    same(requested(h.leave(clocks=[7, 3])), requested({"o": int(Control.LEAVE), "k": [7, 3]}))
    same(sent(h.shutdown()), sent({"o": int(Control.SHUTDOWN), "i": 0}))
    same(sent(h.abort(why="boom")), sent({"o": int(Control.ABORT), "i": 0, "why": "boom"}))
    same(sent(h.ok(rid=5)), sent({"o": int(Control.OK), "i": 5}))


def status_of_a_coordinator() -> dict[str, Any]:
    return {
        "servers": ["tcp://a:1", "tcp://b:2"],
        "workers": [0, 1],
        "done": [],
        "epoch": 2,
        "owners": [0, 1, 1],
        "clocks": {"0": 3, "1": 2},
        "migrations": 1,
        "bytes_moved": 4096,
        "active_servers": [0, 1],
        "live_servers": [0, 1],
        "wanted_servers": 2,
        "migrating": False,
        "speeds": [1e8, 2e8],
        "worker_speeds": [None, [1e8, None]],
    }


def test_tool_and_collective_headers_are_today_s_bytes() -> None:
    status = status_of_a_coordinator()
    same(requested(h.status_request()), requested({"o": int(Control.STATUS)}))
    same(
        sent(h.status_reply(rid=2, status=status)),
        sent({"o": int(Control.OK), "i": 2, **status}),
    )
    same(
        {**h.scale(servers=3), "i": 1, "j": JOB},  # as ask_coordinator sends it
        {**{"o": int(Control.SCALE), "servers": 3}, "i": 1, "j": JOB},
    )
    same(sent(h.scale_reply(rid=1, target=3)), sent({"o": int(Control.OK), "i": 1, "target": 3}))
    same(requested(h.barrier(name="b0")), requested({"o": int(Control.BARRIER), "name": "b0"}))
    meta = {"names": ["w", "b"], "frames": [1, 2]}
    same(
        requested(h.bcast_put(key="bcast0", meta=meta)),
        requested({"o": int(Control.BCAST_PUT), "key": "bcast0", "meta": meta}),
    )
    same(
        requested(h.bcast_get(key="bcast0")),
        requested({"o": int(Control.BCAST_GET), "key": "bcast0"}),
    )
    same(
        sent(h.bcast_value(rid=4, meta=meta)),
        sent({"o": int(Control.BCAST_VALUE), "i": 4, "meta": meta}),
    )


# -- control plane: maps, migration, reports --------------------------------------------

TENSORS = [["w", [4, 3], "float32", 0], ["b", [3], "float32", 0]]
OPT = {"mode": "server", "cls": "SGD", "groups": [{"lr": 0.1}]}


def map_header_as_the_coordinator_builds_it() -> dict[str, Any]:
    return {
        "o": int(Control.MAP),
        "epoch": 1,
        "tensors": TENSORS,
        "chunk_bytes": 256,
        "owners": [0, 1],
        "servers": ["tcp://a:1", "tcp://b:2"],
        "opt": OPT,
        "workers": [0, 1],
        "batching": "equal",
        "consistency": "ssp",
        "report_s": 0.05,
        "time_servers": False,
        "consistency_args": {"staleness": 2},
    }


def built_job_map() -> h.JobMapHeader:
    return h.job_map(
        epoch=1,
        tensors=TENSORS,
        chunk_bytes=256,
        owners=[0, 1],
        servers=["tcp://a:1", "tcp://b:2"],
        opt=OPT,
        workers=[0, 1],
        batching="equal",
        consistency="ssp",
        report_s=0.05,
        time_servers=False,
        consistency_args={"staleness": 2},
    )


def test_map_and_migration_headers_are_today_s_bytes() -> None:
    same(
        requested(h.declare(tensors=TENSORS, opt=OPT)),
        requested({"o": int(Control.DECLARE), "tensors": TENSORS, "opt": OPT}),
    )
    reference = map_header_as_the_coordinator_builds_it()
    built = built_job_map()
    same(built, reference)
    same(sent({**built, "i": 0}), sent({**reference, "i": 0}))  # to each server
    same(sent({**built, "i": 9}), sent({**reference, "i": 9}))  # to each declaring worker
    # To a worker that declared a table the job has (init() after shutdown()): its clock.
    same(sent(h.declared_again(built, rid=9, clock=4)), sent({**reference, "i": 9, "k": 4}))
    same(
        sent(h.migrate(job_map=built, epoch=2, owners=[1, 1], servers=["tcp://a:1", "tcp://b:2"])),
        sent(
            {
                **reference,
                "o": int(Control.MIGRATE),
                "i": 0,
                "epoch": 2,
                "owners": [1, 1],
                "servers": ["tcp://a:1", "tcp://b:2"],
            }
        ),
    )
    assert "i" not in built  # migrate() spread it: the map header itself stays without
    same(sent(h.map_ack(rid=0, epoch=1)), sent({"o": int(Control.MAP_ACK), "i": 0, "epoch": 1}))
    same(
        sent(h.migrate_ack(epoch=2, cuts={"0": 3})),
        sent({"o": int(Control.MIGRATE_ACK), "i": 0, "epoch": 2, "cuts": {"0": 3}}),
    )
    same(
        sent(h.handed(epoch=2, chunks=[0])),
        sent({"o": int(Control.HANDED), "i": 0, "epoch": 2, "c": [0]}),
    )
    same(
        requested(h.map_get(epoch=2, floor=1)),
        requested({"o": int(Control.MAP_GET), "e": 2, "lo": 1}),
    )
    published = {
        "epoch": 2,
        "owners": [1, 1],
        "servers": ["tcp://a:1", "tcp://b:2"],
        "prev": [0, 1],
        "cuts": {"0": 3},
    }
    same(
        sent(h.map_reply(rid=6, **published)),
        sent({"o": int(Control.MAP), "i": 6, **published}),
    )


def test_report_and_load_headers_are_today_s_bytes() -> None:
    def literal(spans: list[list[float]]) -> dict[str, Any]:
        header: dict[str, Any] = {
            "o": int(Control.REPORT),
            "k": 4,
            "b": 32,
            "cs": 0.25,
            "ms": 0.125,
            "cpu": min(1.5, 1.0),
            "lo": 2,
        }
        if spans:
            header["sv"] = spans
        return header

    for spans in ([], [[0, 0.5, 0.25, 4096]]):
        built = h.report(
            clock=4, batch=32, compute_s=0.25, comm_s=0.125, cpu_share=1.0, floor=2, spans=spans
        )
        same(requested(built), requested(literal(spans)))
    same(
        sent(h.report_reply(rid=3, epoch=2)),
        sent({"o": int(Control.OK), "i": 3, "epoch": 2}),
    )
    directive: dict[str, Any] = {"o": int(Control.OK), "i": 3, "epoch": 2}
    directive.update(refresh=True, lead=9)
    same(sent(h.report_reply(rid=3, epoch=2, lead=9)), sent(directive))
    same(
        sent(h.batch_sizes(rid=3, sizes=[20, 12], epoch=2)),
        sent({"o": int(Control.OK), "i": 3, "sizes": [20, 12], "epoch": 2}),
    )
    same(
        sent(h.load(busy_s=0.5, nbytes=1 << 20, requests=12, step=3)),
        sent(
            {
                "o": int(Control.LOAD),
                "i": 0,
                "busy": 0.5,
                "bytes": 1 << 20,
                "n": 12,
                "step": 3,
            }
        ),
    )
    same(sent(h.job_clock(clock=5)), sent({"o": int(Control.OK), "i": 0, "k": 5}))


# -- data plane ---------------------------------------------------------------------------


def tensor_header(op: Data) -> dict[str, Any]:
    """The optimizer's _tensor_header for chunk 3 (float32, 10 elements) at epoch 2."""
    return {"o": int(op), "c": 3, "e": 2, "dt": "float32", "n": 10}


def push_literal(
    *, hp: dict[str, Any] | None, dt: str | None, sm: list[Any] | None, data: memoryview | None
) -> dict[str, Any]:
    """The optimizer's _push for one chunk, step by step; dt None: no gradient."""
    header = tensor_header(Data.PUSH)
    header.update(r=1, k=4, w=16.0, v=3)
    if hp is not None:
        header["hp"] = hp
    if dt is None:
        header["z"] = True
    else:
        header["dt"] = dt
        if sm is not None:
            header["sm"] = sm
        elif data is not None:
            inline(header, data)
    return header


@pytest.mark.parametrize(
    "hp, dt, sm, small",
    [
        (None, "float32", None, True),  # inline
        (None, "float32", None, False),  # its own frame
        ({"lr": 0.05}, "float16", None, True),  # compressed, hyperparameters changed
        (None, "float32", ["trimtab-job1-w0", 4096, 8192], False),  # shared memory
        (None, None, None, False),  # no gradient
        ({"lr": 0.05}, None, None, False),
    ],
)
def test_push_is_today_s_bytes(
    hp: dict[str, Any] | None, dt: str | None, sm: list[Any] | None, small: bool
) -> None:
    data = memoryview(bytes(40 if small else 8000))
    built = h.push(
        chunk=3,
        epoch=2,
        dtype="float32" if dt is None else dt,
        numel=10,
        rank=1,
        clock=4,
        weight=16.0,
        version=3,
        hp=hp,
        empty=dt is None,
    )
    if sm is not None:
        built["sm"] = sm
    elif dt is not None:
        inline(built, data)
    same(requested(built), requested(push_literal(hp=hp, dt=dt, sm=sm, data=data)))


def test_other_worker_requests_are_today_s_bytes() -> None:
    same(
        requested(h.init(chunk=3, epoch=2, dtype="float32", numel=10)),
        requested(tensor_header(Data.INIT)),
    )
    same(
        requested(h.pull(chunk=3, epoch=2)),
        requested({"o": int(Data.PULL), "c": 3, "e": 2}),
    )
    same(requested(h.stats_request()), requested({"o": int(Data.STATS)}))


def value_literal(*, dt: str | None, slot: bool, data: memoryview | None) -> dict[str, Any]:
    """The server's _send_value, step by step; dt None: no value."""
    header: dict[str, Any] = {"o": int(Data.VALUE), "i": 8, "c": 3, "v": 5, "k": 5, "n": 10}
    if dt is None:
        header["z"] = True
        return header
    header["dt"] = dt
    if slot:
        header["sm"] = 1
    elif data is not None:
        inline(header, data)
    return header


@pytest.mark.parametrize(
    "dt, slot, small",
    [("float32", False, True), ("float32", False, False), ("float32", True, False), (None, 0, 0)],
)
def test_value_is_today_s_bytes(dt: str | None, slot: bool, small: bool) -> None:
    data = memoryview(bytes(40 if small else 8000))
    built = h.value(rid=8, chunk=3, version=5, round=5, numel=10, dtype=dt)
    if dt is not None and slot:
        built["sm"] = h.IN_SLOT
    elif dt is not None:
        inline(built, data)
    same(sent(built), sent(value_literal(dt=dt, slot=slot, data=data)))


def test_server_replies_are_today_s_bytes() -> None:
    same(
        sent(h.moved(rid=8, chunk=3, owner=1, epoch=4)),
        sent({"o": int(Data.MOVED), "i": 8, "c": 3, "s": 1, "e": 4}),
    )
    same(sent(h.ack(rid=8)), sent({"o": int(Data.ACK), "i": 8}))
    stats = stats_of_a_server()
    same(sent(h.stats_reply(rid=8, stats=stats)), sent({"o": int(Data.ACK), "i": 8, **stats}))


def stats_of_a_server() -> dict[str, Any]:
    return {
        "index": 0,
        "epoch": 1,
        "versions": {"0": 3},
        "pushes": 6,
        "shared": 0,
        "lane": 6,
        "dropped": 0,
        "discounted": 0,
        "held": 0,
        "errors": 0,
        "moved_in": 0,
        "moved_out": 0,
        "busy_s": 0.01,
        "bytes": 4096,
    }


@pytest.mark.parametrize("server_mode", [True, False])
def test_handover_is_today_s_bytes(server_mode: bool) -> None:
    hp = {"lr": 0.1, "momentum": 0.9}
    state = {"momentum_buffer": ["t", "float32", [10]], "step": ["v", 3]}
    literal: dict[str, Any] = {  # the server's _maybe_hand_over, step by step
        "o": int(Data.HANDOVER),
        "c": 3,
        "v": 5,
        "k": 5,
        "e": 2,
        "dt": "float32",
        "n": 10,
    }
    literal["p"] = [6, 0, 1]
    if server_mode:
        literal["hp"] = hp
        literal["st"] = state
    literal["i"] = 11
    built = h.handover(
        rid=11,
        chunk=3,
        version=5,
        round=5,
        epoch=2,
        dtype="float32",
        numel=10,
        counts=[6, 0, 1],
        hp=hp if server_mode else None,
        state=state if server_mode else None,
    )
    same(sent(built), sent(literal))


# -- readers ----------------------------------------------------------------------------


def received(header: Any) -> dict[str, Any]:
    """What the receiver's decode() gives for a header as sent."""
    return decode(encode({**header, "j": JOB}), JOB)


def full_push() -> h.PushHeader:
    built = h.push(
        chunk=3, epoch=2, dtype="float32", numel=10, rank=1, clock=4, weight=16.0, version=3
    )
    built["hp"] = {"lr": 0.1}
    built["sm"] = ["trimtab-job1-w0", 0, 64]
    return built


Reader = Callable[[dict[str, Any]], Any]

# reader, a header it takes, its required keys, its optional keys present in that header
CASES: list[tuple[Reader, Any, list[str], list[str]]] = [
    (h.read_register, h.register_server(rid=1, addr="tcp://a:1"), ["role", "addr"], []),
    (
        h.read_registered,
        h.registered(rid=1, rank=0, num_workers=2, num_servers=1, chunk_bytes=256, heartbeat_s=1.0),
        ["rank", "num_workers", "num_servers", "chunk_bytes", "heartbeat_s"],
        [],
    ),
    (h.read_abort, h.abort(why="x"), ["why"], []),
    (h.read_leave, h.leave(clocks=[4, 2]), ["k"], []),
    (
        h.read_status_reply,
        h.status_reply(rid=1, status=status_of_a_coordinator()),
        list(status_of_a_coordinator()),
        [],
    ),
    (h.read_scale, h.scale(servers=2), ["servers"], []),
    (h.read_scale_reply, h.scale_reply(rid=1, target=2), ["target"], []),
    (h.read_barrier, h.barrier(name="b"), ["name"], []),
    (h.read_bcast_put, h.bcast_put(key="k", meta={"names": [], "frames": []}), ["key", "meta"], []),
    (h.read_bcast_get, h.bcast_get(key="k", replayed=True), ["key"], ["rp"]),
    (h.read_bcast_value, h.bcast_value(rid=1, meta={"names": [], "frames": []}), ["meta"], []),
    (h.read_declare, h.declare(tensors=TENSORS, opt=OPT), ["tensors", "opt"], []),
    (
        h.read_job_map,
        built_job_map(),
        ["epoch", "tensors", "chunk_bytes", "owners", "servers", "opt", "workers"],
        ["batching", "consistency", "report_s", "time_servers", "consistency_args"],
    ),
    (
        h.read_job_map,
        h.declared_again(built_job_map(), rid=3, clock=5),
        ["epoch", "tensors", "chunk_bytes", "owners", "servers", "opt", "workers"],
        ["k"],
    ),
    (
        h.read_migrate,
        h.migrate(job_map=built_job_map(), epoch=2, owners=[1, 1], servers=["a", "b"]),
        ["epoch", "tensors", "chunk_bytes", "owners", "servers", "opt", "workers"],
        ["batching", "consistency", "report_s", "time_servers", "consistency_args"],
    ),
    (h.read_map_ack, h.map_ack(rid=0, epoch=1), ["epoch"], []),
    (h.read_migrate_ack, h.migrate_ack(epoch=2, cuts={"0": 3}), ["epoch", "cuts"], []),
    (h.read_handed, h.handed(epoch=2, chunks=[0, 1]), ["epoch", "c"], []),
    (h.read_map_get, h.map_get(epoch=2, floor=1), ["e"], ["lo"]),
    (
        h.read_map_reply,
        h.map_reply(rid=1, epoch=2, owners=[0], servers=["a"], prev=[1], cuts={"0": 1}),
        ["epoch", "owners", "servers", "prev", "cuts"],
        [],
    ),
    (
        h.read_report,
        h.report(
            clock=1,
            batch=8,
            compute_s=0.1,
            comm_s=0.1,
            cpu_share=1.0,
            floor=1,
            spans=[[0, 1, 1, 1]],
        ),
        ["k", "b", "cs", "ms", "cpu"],
        ["lo", "sv"],
    ),
    (h.read_report_reply, h.report_reply(rid=1, epoch=2, lead=5), ["epoch"], ["refresh", "lead"]),
    (h.read_report_reply, h.batch_sizes(rid=1, sizes=[1, 2], epoch=2), ["epoch"], ["sizes"]),
    (
        h.read_load,
        h.load(busy_s=0.1, nbytes=10, requests=2, step=1, bytes_out=4),
        ["busy", "bytes", "n", "step"],
        ["bo"],
    ),
    (h.read_job_clock, h.job_clock(clock=3), ["k"], []),
    (h.read_init, h.init(chunk=1, epoch=1, dtype="float32", numel=4), ["c", "e", "dt", "n"], []),
    (h.read_push, full_push(), ["c", "e", "r", "k", "w", "dt", "n"], ["v", "hp", "sm"]),
    (
        h.read_push,
        h.push(
            chunk=3,
            epoch=2,
            dtype="float32",
            numel=10,
            rank=1,
            clock=4,
            weight=1,
            version=3,
            empty=True,
        ),
        ["c", "e", "r", "k", "w"],
        ["v"],
    ),
    (h.read_pull, h.pull(chunk=1, epoch=1), ["c", "e"], []),
    (
        h.read_value,
        h.value(rid=1, chunk=1, version=2, round=2, numel=4, dtype="float32"),
        ["c", "v", "k", "n", "dt"],
        [],
    ),
    (
        h.read_value,
        {**h.value(rid=1, chunk=1, version=2, round=2, numel=4, dtype=None)},
        ["c", "v", "k", "n"],
        [],
    ),
    (h.read_moved, h.moved(rid=1, chunk=1, owner=0, epoch=3), ["c", "s", "e"], []),
    (
        h.read_stats_reply,
        h.stats_reply(rid=1, stats=stats_of_a_server()),
        list(stats_of_a_server()),
        [],
    ),
    (
        h.read_handover,
        h.handover(
            rid=1,
            chunk=1,
            version=2,
            round=2,
            epoch=1,
            dtype="float32",
            numel=4,
            counts=[1, 0, 0],
            hp={"lr": 0.1},
            state={},
        ),
        ["c", "v", "k", "e", "dt", "n", "p"],
        ["hp", "st"],
    ),
    (
        read_error,
        error_header(JOB, 1, ErrorCode.BAD_STATE.value, "no", data=True),
        ["code", "msg"],
        [],
    ),
]


def refused(reader: Reader, header: dict[str, Any]) -> str:
    with pytest.raises(ProtocolError) as info:
        reader(header)
    return error_of(info.value)[0]


def mistyped(value: Any) -> Any:
    return 1 if isinstance(value, str) else "x"


@pytest.mark.parametrize("reader, header, required, optional", CASES)
def test_each_reader_takes_its_builder_s_header_and_refuses_a_missing_or_mistyped_key(
    reader: Reader, header: Any, required: list[str], optional: list[str]
) -> None:
    good = received(header)
    assert reader(good) is good
    for key in required:
        assert key in good, key
        missing = received(header)
        del missing[key]
        assert refused(reader, missing) == ErrorCode.MALFORMED.value, f"without {key!r}"
    for key in [*required, *optional]:
        bad = received(header)
        bad[key] = mistyped(bad[key])
        assert refused(reader, bad) == ErrorCode.MALFORMED.value, f"{key!r} mistyped"
    for key in optional:
        absent = received(header)
        del absent[key]
        assert reader(absent) is absent, f"without {key!r}"


def test_int_keys_refuse_a_bool_and_number_keys_take_an_int() -> None:
    push = received(full_push())
    push["c"] = True
    assert refused(h.read_push, push) == ErrorCode.MALFORMED.value
    push = received(full_push())
    push["w"] = 4  # an int batch size is a weight
    assert h.read_push(push) is push
    value = received(h.value(rid=1, chunk=1, version=2, round=2, numel=4, dtype="float32"))
    value["sm"] = True
    assert refused(h.read_value, value) == ErrorCode.MALFORMED.value


def test_a_push_without_gradient_needs_no_dtype_but_one_with_a_gradient_does() -> None:
    # Tests and tools push "no gradient" with only the keys the server reads.
    bare = {"o": int(Data.PUSH), "c": 0, "e": 1, "r": 0, "k": 0, "w": 1, "v": 0, "z": True}
    assert h.read_push(received(bare)) is not None
    gradient = received({**bare, "z": False})
    assert "dtype" not in gradient
    assert refused(h.read_push, gradient) == ErrorCode.MALFORMED.value


def test_no_tensor_is_said_with_a_bool() -> None:
    for reader, header in [
        (h.read_push, received(full_push())),
        (h.read_value, received(h.value(rid=1, chunk=1, version=2, round=2, numel=4, dtype=None))),
    ]:
        header["z"] = 1
        assert refused(reader, header) == ErrorCode.MALFORMED.value


def test_a_push_s_hyperparameters_may_be_null_as_the_server_took_them() -> None:
    push = received(full_push())
    push["hp"] = None
    assert h.read_push(push) is push


@pytest.mark.parametrize(
    "sm", ["x", ["arena", 0], ["arena", 0, "64"], [1, 0, 64], ["arena", True, 64]]
)
def test_a_push_s_slot_must_be_name_offset_capacity(sm: Any) -> None:
    push = received(full_push())
    push["sm"] = sm
    with pytest.raises(ProtocolError, match="'sm' must be"):
        h.read_push(push)


@pytest.mark.parametrize(
    "reader, key, value",
    [
        (h.read_migrate_ack, "cuts", {"zero": 3}),
        (h.read_migrate_ack, "cuts", {"0": "3"}),
        (h.read_handed, "c", [0, "1"]),
        (h.read_report_reply, "sizes", [1, None]),
        (h.read_handover, "p", [1, 0]),
        (h.read_bcast_value, "meta", {"names": []}),
    ],
)
def test_readers_look_inside_lists_and_maps(reader: Reader, key: str, value: Any) -> None:
    header = {
        h.read_migrate_ack: h.migrate_ack(epoch=2, cuts={"0": 3}),
        h.read_handed: h.handed(epoch=2, chunks=[0]),
        h.read_report_reply: h.batch_sizes(rid=1, sizes=[1, 2], epoch=2),
        h.read_handover: h.handover(
            rid=1, chunk=1, version=2, round=2, epoch=1, dtype="float32", numel=4, counts=[1, 0, 0]
        ),
        h.read_bcast_value: h.bcast_value(rid=1, meta={"names": [], "frames": []}),
    }[reader]
    bad = received(header)
    bad[key] = value
    assert refused(reader, bad) == ErrorCode.MALFORMED.value


def test_a_leave_s_clocks_are_whole_numbers_from_0() -> None:
    for bad in ([1, -1], [1, True], [1.5]):
        header = received(h.leave(clocks=[0]))
        header["k"] = bad
        assert refused(h.read_leave, header) == ErrorCode.MALFORMED.value, bad


def test_the_floor_is_optional_but_typed() -> None:
    assert h.read_floor(received(h.heartbeat())) is None
    assert h.read_floor(received(h.worker_heartbeat(job=JOB, floor=3))) == 3
    assert refused(h.read_floor, received({"o": int(Control.HEARTBEAT), "lo": "old"})) == (
        ErrorCode.MALFORMED.value
    )


def test_every_op_has_a_builder() -> None:
    built = [
        h.register_server(rid=1, addr="a"),
        h.registered(rid=1, rank=0, num_workers=1, num_servers=1, chunk_bytes=1, heartbeat_s=1),
        h.heartbeat(),
        h.declare(tensors=[], opt={}),
        built_job_map(),
        h.map_ack(rid=0, epoch=1),
        h.barrier(name="b"),
        h.bcast_put(key="k", meta={}),
        h.bcast_get(key="k"),
        h.bcast_value(rid=1, meta={}),
        h.done(),
        h.leave(clocks=[]),
        h.shutdown(),
        h.abort(why="x"),
        h.ok(rid=1),
        error_header(JOB, 1, "x", "y", data=False),
        h.status_request(),
        h.report(clock=0, batch=1, compute_s=0, comm_s=0, cpu_share=0, floor=0, spans=[]),
        h.migrate(job_map=built_job_map(), epoch=2, owners=[], servers=[]),
        h.extend(job_map=built_job_map()),
        h.migrate_ack(epoch=1, cuts={}),
        h.handed(epoch=1, chunks=[]),
        h.map_get(epoch=1, floor=1),
        h.load(busy_s=0, nbytes=0, requests=0, step=0),
        h.scale(servers=1),
        h.gather(key="k", sig="s", meta={}),
        h.gathered(rid=1, metas=[], n=[], last=0),
        h.adopt(root=0),
        h.init(chunk=0, epoch=1, dtype="float32", numel=1),
        h.push(chunk=0, epoch=1, dtype="f", numel=1, rank=0, clock=0, weight=1, version=0),
        h.pull(chunk=0, epoch=1),
        h.value(rid=1, chunk=0, version=0, round=0, numel=1, dtype=None),
        h.moved(rid=1, chunk=0, owner=0, epoch=1),
        h.ack(rid=1),
        error_header(JOB, 1, "x", "y", data=True),
        h.stats_request(),
        h.handover(
            rid=1, chunk=0, version=0, round=0, epoch=1, dtype="f", numel=1, counts=[0, 0, 0]
        ),
        h.state_get(chunk=0, epoch=1),
        h.state(rid=1, chunk=0, version=0, round=0, hp={}, state={}),
        h.state_set(chunk=0, epoch=1, state={}),
        *elastic_builders(),
        replica.failover(epoch=2, dead=0, owners=[], backups=[], servers=[]),
        replica.failover_ack(epoch=2),
        replica.holdings(epoch=3),
        replica.held(epoch=3, rounds={0: 4}),
        replica.replicate(
            rid=1,
            chunk=0,
            version=0,
            round=0,
            epoch=1,
            sender=0,
            token=b"t",
            dtype="float32",
            numel=1,
            counts=[0, 0, 0],
            last_sum=0.0,
            last_clock={},
        ),
        h.checkpoint(),
        h.snapshot(number=1, clock=5, directory="d"),
        h.snapshot_done(number=1, clock=5, file="f", chunks=2),
        h.restore(directory="d", files=["f"]),
        h.restored(chunks=2),
        h.credit(rid=1),
        map_news(h.map_reply(rid=0, epoch=1, owners=[], servers=[], prev=[], cuts={})),
        rejoin.rejoin_worker(rank=0, nonce=b"n" * 16, proof=b"p" * 16, floor=1),
        rejoin.rejoined(proof=b"p" * 16),
        decode(batch.pack(1, JOB, [[encode(h.pull(chunk=0, epoch=1))]])[0], JOB),
    ]
    assert sorted(b["o"] for b in built) == sorted(int(op) for op in [*Control, *Data])


def test_internal_is_an_error_code() -> None:
    assert ErrorCode.INTERNAL.value == "internal"


def test_state_messages_read_what_they_built_and_refuse_a_bad_state_entry() -> None:
    """STATE_GET, STATE, STATE_SET: each reader takes its builder's header; a state
    entry that is neither ['t', dtype, shape] nor ['v', value] is MALFORMED."""
    meta = {"step": ["t", "float32", []], "exp_avg": ["t", "float32", [4]], "n": ["v", 3]}
    h.read_state_get(dict(h.state_get(chunk=2, epoch=1)))
    h.read_state(dict(h.state(rid=1, chunk=2, version=3, round=3, hp={"lr": 0.1}, state=meta)))
    built = h.state_set(chunk=2, epoch=1, state=meta, hp={"lr": 0.1}, dtype="float32", numel=4)
    assert h.read_state_set(dict(built))["n"] == 4
    assert "dt" not in h.state_set(chunk=2, epoch=1, state={})
    for bad in ({"x": ["t", "float32", [-1]]}, {"x": ["q", 1]}, {"x": ["t", "float32"]}):
        with pytest.raises(ProtocolError, match="'st' entry 'x'"):
            h.read_state_set(dict(h.state_set(chunk=2, epoch=1, state=bad)))
    with pytest.raises(ProtocolError, match="'n'"):
        h.read_state_set({"o": int(Data.STATE_SET), "c": 2, "e": 1, "st": {}, "dt": "float32"})
    pushed = h.push(
        chunk=0,
        epoch=1,
        dtype="float32",
        numel=1,
        rank=0,
        clock=0,
        weight=1,
        version=0,
        mean_only=True,
    )
    assert h.read_push(dict(pushed))["g"] is True
    with pytest.raises(ProtocolError, match="'g'"):
        h.read_push({**pushed, "g": 1})


def test_checkpoint_messages_read_what_they_built_and_refuse_what_says_two_things() -> None:
    """SNAPSHOT_DONE says exactly one of written (file, with its chunk count), late or
    failed; RESTORED one of loaded or failed; a negative SNAPSHOT clock is MALFORMED."""
    assert h.read_snapshot(received(h.snapshot(number=1, clock=5, directory="d")))["k"] == 5
    for done in (
        h.snapshot_done(number=1, clock=5, file="f", chunks=2),
        h.snapshot_done(number=1, clock=5, late=7),
        h.snapshot_done(number=1, clock=5, err="disk full"),
    ):
        h.read_snapshot_done(received(done))
    for bad in (
        {**h.snapshot_done(number=1, clock=5, late=7), "err": "x"},
        h.snapshot_done(number=1, clock=5),
        {**h.snapshot_done(number=1, clock=5, file="f"), "c": "2"},
        {"o": int(Control.SNAPSHOT_DONE), "n": 1, "k": 5, "file": "f"},
    ):
        assert refused(h.read_snapshot_done, received(bad)) == ErrorCode.MALFORMED.value, bad
    assert refused(h.read_snapshot, received(h.snapshot(number=1, clock=-1, directory="d")))
    assert h.read_restored(received(h.restored(chunks=3)))["n"] == 3
    assert "err" in h.read_restored(received(h.restored(err="gone")))
    assert refused(h.read_restored, received({"o": int(Control.RESTORED)}))
    assert refused(h.read_restore, received({**h.restore(directory="d", files=[]), "files": [1]}))
    reply = h.checkpoint_reply(rid=3, path="/x/ckpt-00000005", clock=5)
    assert h.read_checkpoint_reply(received(reply))["k"] == 5
