"""Horovod's collectives below the torch API: the coordinator's gathers as pure
operations (and through its dispatch table), the GATHER/GATHERED headers, the reduce ops,
and the compressors' Horovod interface."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trimtab.errors import ConfigError, ProtocolError
from trimtab.frontend.compression import Compression
from trimtab.frontend.ops import Adasum, Average, Max, Min, ReduceOp, Sum, reduce_op
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, ErrorCode, decode, encode
from trimtab.roles.coordinator import Coordinator, CoordinatorConfig
from trimtab.roles.coordinator.collectives import Collectives, Part
from trimtab.roles.coordinator.outbox import Refuse, Send
from trimtab.transport import Fabric


def part(peer: bytes, rid: int, sig: str = "s", meta: Any = None, *frames: bytes) -> Part:
    return Part(peer, rid, sig, meta or {}, list(frames))


def test_a_gather_answers_every_worker_with_every_part_in_rank_order_once_all_sent() -> None:
    c = Collectives(3)
    assert c.gather(2, "#0", part(b"c", 7, "s", {"d": 2}, b"cc")) == []
    assert c.gather(0, "#0", part(b"a", 5, "s", {"d": 0})) == []
    assert c.pending() == {"#0": [0, 2]}
    out = c.gather(1, "#0", part(b"b", 6, "s", {"d": 1}, b"b1", b"b2"))
    assert c.pending() == {}
    assert sorted((m.peer, m.header["i"]) for m in out) == [(b"a", 5), (b"b", 6), (b"c", 7)]
    for m in out:
        assert isinstance(m, Send)
        g = headers.read_gathered(dict(m.header))
        assert g["metas"] == [{"d": 0}, {"d": 1}, {"d": 2}]
        assert g["n"] == [0, 2, 1]  # rank 0 sent no buffer (a broadcast's non-root)
        assert g["last"] == 1
        assert list(m.frames) == [b"b1", b"b2", b"cc"]
    # The key is free again: the next step's collective of the same name completes too.
    assert c.gather(0, "#0", part(b"a", 8)) == []


def test_workers_that_disagree_are_all_refused_with_every_rank_s_signature() -> None:
    c = Collectives(2)
    c.gather(1, "@loss", part(b"b", 2, "allreduce float32 shape=[2]"))
    out = c.gather(0, "@loss", part(b"a", 1, "allreduce float32 shape=[3]"))
    assert {m.peer for m in out} == {b"a", b"b"}
    for m in out:
        assert isinstance(m, Refuse) and m.code == ErrorCode.MISMATCH.value
        assert "collective 'loss'" in m.msg
        assert "rank 0: allreduce float32 shape=[3]; rank 1: allreduce float32 shape=[2]" in m.msg
    assert c.pending() == {}


def test_a_worker_sending_a_key_twice_at_once_is_refused_alone() -> None:
    c = Collectives(2)
    c.gather(0, "@x", part(b"a", 1))
    with pytest.raises(ProtocolError, match="sent it twice") as exc:
        c.gather(0, "@x", part(b"a", 2))
    assert exc.value.args[0] == ErrorCode.BAD_STATE.value
    assert len(c.gather(1, "@x", part(b"b", 3))) == 2  # the first one still completes


def test_a_worker_that_leaves_fails_the_gathers_waiting_for_it_and_later_ones() -> None:
    c = Collectives(3)
    c.gather(0, "#4", part(b"a", 1))
    c.gather(1, "#4", part(b"b", 2))
    c.gather(2, "#5", part(b"c", 3))  # the leaving worker's own part: nobody waits on it
    out = c.left(2)
    assert [(m.peer, m.rid) for m in out if isinstance(m, Refuse)] == [(b"a", 1), (b"b", 2)]
    assert all(isinstance(m, Refuse) and "worker 2 left the job" in m.msg for m in out)
    assert "unnamed collective #4" in out[0].msg  # type: ignore[union-attr]
    with pytest.raises(ProtocolError, match=r"worker\(s\) \[2\] left the job"):
        c.gather(0, "#6", part(b"a", 4))


def test_the_dispatch_table_takes_gathers_from_workers_only() -> None:
    fabric = Fabric()
    coordinator = Coordinator(CoordinatorConfig(1, 1, "j"), fabric.transport(bind=True))
    node = fabric.transport(bind=False)
    to = node.connect(coordinator.address)

    def ask(header: dict[str, Any], *frames: bytes) -> tuple[dict[str, Any], list[Any]]:
        node.send(to, [encode({"j": "j", "i": 9, **header}), *frames])
        env = coordinator._transport.recv(1.0)
        assert env is not None
        coordinator._dispatch(env.peer, env.frames)
        reply = node.recv(1.0)
        assert reply is not None
        return decode(reply.frames[0], "j"), list(reply.frames[1:])

    ask(dict(headers.register_worker(rank=0)))
    gather = dict(headers.gather(key="#0", sig="join", meta={"d": 1}))
    reply, frames = ask(gather, b"xyz")  # one worker: its own part completes it
    assert reply["o"] == int(Control.GATHERED) and reply["metas"] == [{"d": 1}]
    assert [bytes(f) for f in frames] == [b"xyz"] and reply["last"] == 0
    bad, _ = ask({"o": int(Control.GATHER), "key": "#1", "sig": 3, "meta": {}})
    assert bad["code"] == "malformed"
    done, _ = ask(dict(headers.done()))
    assert done["o"] == int(Control.OK)
    node.close()
    coordinator._transport.close()


def test_gathered_headers_are_checked() -> None:
    ok = dict(headers.gathered(rid=1, metas=[{}, {}], n=[1, 0], last=1))
    assert headers.read_gathered(ok)["n"] == [1, 0]
    for broken in (
        {**ok, "n": [1]},
        {**ok, "metas": [{}, 3]},
        {**ok, "last": "1"},
        {k: v for k, v in ok.items() if k != "metas"},
    ):
        with pytest.raises(ProtocolError):
            headers.read_gathered(broken)
    with pytest.raises(ProtocolError):
        headers.read_gather({"o": int(Control.GATHER), "key": "k", "sig": "s"})


def test_reduce_ops_follow_horovod_s_arguments() -> None:
    assert reduce_op() is Average and reduce_op(average=True) is Average
    assert reduce_op(average=False) is Sum
    assert reduce_op(Max) is Max and reduce_op("SUM") is Sum and reduce_op("ReduceOp.MIN") is Min
    assert str(Average) == "average"  # the optimizer compares op names as strings
    with pytest.raises(ConfigError, match=r"use op=trimtab\.Average or op=trimtab\.Sum"):
        reduce_op(Adasum)
    with pytest.raises(ConfigError, match="not both"):
        reduce_op(Sum, average=True)
    with pytest.raises(ConfigError, match="unknown reduction op"):
        reduce_op("median")
    assert {o.value for o in ReduceOp} >= {"average", "sum", "min", "max", "product"}


def test_compressors_have_horovod_s_compress_and_decompress() -> None:
    t = torch.tensor([1.0, 2.5], dtype=torch.float64)
    c, ctx = Compression.fp16.compress(t)
    assert c.dtype is torch.float16 and ctx is torch.float64
    back = Compression.fp16.decompress(c, ctx)
    assert back.dtype is torch.float64 and back.tolist() == [1.0, 2.5]
    b, ctx = Compression.bf16.compress(t.float())
    assert b.dtype is torch.bfloat16
    ints = torch.tensor([3])
    same, ctx = Compression.fp16.compress(ints)  # only float32/float64 narrow
    assert same is ints and Compression.fp16.decompress(same, ctx) is ints
    plain, ctx = Compression.none.compress(t)
    assert plain is t and Compression.none.decompress(plain, ctx) is t
