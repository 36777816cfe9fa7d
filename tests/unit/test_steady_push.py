"""The server's steady-state push (roles/server/steady.py) against the general path:
the same pushes, authenticated, through both, must leave the same values, optimizer
state, rounds, counters and send the same bytes; a push it does not take (or one that
fails a check) goes to the general path with nothing changed, refused as before."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from trimtab.errors import ChunkMoved, ProtocolError
from trimtab.protocol.messages import Data, decode, encode, error_of
from trimtab.roles.server.meter import LoadMeter
from trimtab.roles.server.receipt import Receipts
from trimtab.roles.server.replica import Replicas
from trimtab.roles.server.slots import SharedArenas
from trimtab.roles.server.steady import SteadyPush
from trimtab.roles.server.store import ChunkStore
from trimtab.runtime.credentials import WORKER, Credentials, credential
from trimtab.runtime.loop import NodeLoop
from trimtab.runtime.tensors import as_bytes

JOB = "steadyjob"
KEY = b"k" * 32
WORKERS = [0, 1]


class _Wire:
    """A transport that records what is sent, as bytes."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, list[bytes]]] = []

    def send(self, peer: bytes, frames: Sequence[Any]) -> None:
        self.sent.append((peer, [bytes(f) for f in frames]))

    def through_lane(self, peer: bytes) -> bool:
        return peer.endswith(b"1")


class _Side:
    """One server's parts, served by the steady path (``steady``) or the general one."""

    def __init__(self, mode: str, steady: bool) -> None:
        self.wire = _Wire()
        self.loop = NodeLoop(JOB, self.wire, logging.getLogger("test"))  # type: ignore[arg-type]
        self.meter = LoadMeter()
        self.store = ChunkStore(self.meter, SharedArenas(JOB))
        self.store.index = 0
        self.store.apply_map(
            {
                # 2048 float32 (8 KiB: a frame of its own) in two chunks; 8 (inline values)
                "tensors": [["w", [4096], "float32", 0], ["b", [8], "float32", 0]],
                "chunk_bytes": 8192,
                "workers": WORKERS,
                "servers": ["inproc://s0"],
                "opt": {
                    "mode": mode,
                    "cls": "SGD",
                    "groups": [{"lr": 0.25, "momentum": 0.9, "weight_decay": 0.01}],
                },
                "owners": [0, 0, 0],
                "epoch": 1,
                "consistency": "bsp",
            }
        )
        self.credentials = Credentials(JOB)
        self.credentials.learn(KEY, len(WORKERS), None)
        self.receipts = Receipts(self.loop, self.meter)
        self.replicas = Replicas(self.store, self.credentials, False)
        self.steady = (
            SteadyPush(
                self.store, self.credentials, self.receipts, self.replicas, self.wire.through_lane
            )
            if steady
            else None
        )
        self.taken = 0  # pushes the steady path took

    def serve(self, peer: bytes, message: list[bytes]) -> tuple[str, str] | None:
        """A PUSH as ``Server._on_data`` routes it (no moves, replicas or failover)."""
        frames = [memoryview(bytearray(f)) for f in message]
        header = decode(frames[0], JOB)
        try:
            if self.steady is not None and self.steady.push(peer, frames, header):
                self.taken += 1
                return None
            self.credentials.worker(header)
            replies = self.store.push(peer, header, frames[1:], self.wire.through_lane(peer))
            for r in replies:
                self.receipts.reply(r)
        except ChunkMoved as gone:
            return ("moved", str(gone.chunk))
        except ProtocolError as exc:
            return error_of(exc)
        return None

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stats": self.store.stats(), "sent": self.wire.sent}
        out["meter"] = (self.meter.bytes, self.meter.bytes_out, self.meter.step)
        out["lane"] = self.store.lane_pushes
        out["held"] = self.receipts.values.stats.held
        for cid, c in self.store.chunks.items():
            opt = c.optimizer
            out[f"chunk{cid}"] = (
                c.value.tolist(),
                c.merge.tolist() if c.any_grad else None,
                None if c.last_mean is None else c.last_mean.tolist(),
                (c.version, c.round, c.pushes, c.dropped, c.mean_round, c.mean_any),
                (c.weight_sum, c.scale, c.last_sum, sorted(c.arrived), dict(c.last_clock)),
                None
                if opt is None
                else [
                    {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                    for s in opt.optimizer.state.values()
                ],
            )
        return out


def _push(cid: int, rank: int, clock: int, grad: torch.Tensor, **more: Any) -> list[bytes]:
    header: dict[str, Any] = {
        "o": int(Data.PUSH),
        "i": 100 * clock + 10 * cid + rank,
        "j": JOB,
        "c": cid,
        "e": 1,
        "dt": "float32",
        "n": grad.numel(),
        "r": rank,
        "k": clock,
        "w": 1.0 + rank,
        "v": clock,
        "t": credential(KEY, JOB, WORKER, rank),
        **more,
    }
    header = {k: v for k, v in header.items() if v is not None}
    return [encode(header), bytes(as_bytes(grad))]


def _script() -> list[tuple[bytes, list[bytes]]]:
    """Three rounds of both workers' pushes of every chunk, some bounded (``ak``/``vk``),
    with pushes the steady path leaves to the general one (compressed, ``hp``, ``g``,
    an inline payload) and bad ones among them (a wrong credential, clock, size, dtype,
    chunk, weight, a second push of the round)."""
    g = torch.Generator().manual_seed(7)
    out: list[tuple[bytes, list[bytes]]] = []
    sizes = {0: 2048, 1: 2048, 2: 8}
    for clock in range(3):
        for cid in (1, 0, 2):
            for rank in WORKERS:
                grad = torch.randn(sizes[cid], generator=g)
                peer = b"w%d" % rank
                bounded = {"ak": True, "vk": 4096 * 3} if rank == 1 else {}
                if clock == 0 and rank == 0:  # refused: steady path and general alike
                    out.append((peer, _push(cid, rank, clock, grad, t=b"x" * 16)))
                    out.append((peer, _push(cid, rank, clock + 1, grad)))
                    out.append((peer, _push(cid, rank, clock, grad, n=3)))
                    out.append((peer, _push(cid, rank, clock, grad, dt="float64")))
                    out.append((peer, _push(cid, rank, clock, grad, w=0)))
                    out.append((peer, _push(cid, rank, clock, grad, w=True)))
                    out.append((peer, _push(cid, rank, clock, grad, c=99)))
                    out.append((peer, _push(cid, rank, clock, grad, r=5)))
                    out.append((peer, _push(cid, rank, clock, grad, k="0")))
                if clock == 1 and cid == 0 and rank == 1:
                    half = grad.to(torch.float16)
                    message = _push(cid, rank, clock, half, dt="float16", **bounded)
                elif clock == 2 and cid == 1 and rank == 0:
                    message = _push(cid, rank, clock, grad, hp={"lr": 0.125})
                else:
                    message = _push(cid, rank, clock, grad, **bounded)
                out.append((peer, message))
                if clock == 1 and rank == 0:  # a second push of the round: refused
                    out.append((peer, _push(cid, rank, clock, grad)))
    return out


@pytest.mark.parametrize("mode", ["server", "summation"])
def test_the_steady_path_does_what_the_general_path_does(mode: str) -> None:
    general, steady = _Side(mode, False), _Side(mode, True)
    for peer, message in _script():
        assert steady.serve(peer, message) == general.serve(peer, message)
        assert steady.state() == general.state()
    assert steady.taken >= 10  # most pushes took it
    assert general.store.chunks[0].round == 3 and general.store.chunks[0].version == 3
    assert general.state()["held"] > 0  # (values held to a window: compared above)


def test_anything_but_the_steady_state_is_left_to_the_general_path() -> None:
    side = _Side("server", True)
    grad = torch.ones(2048)
    assert side.serve(b"w0", _push(0, 0, 0, grad, sm=["a", 0, 8])) is not None  # general's
    assert side.taken == 0
    side.store.consistency = type(side.store.consistency).__new__(  # an SSP-like policy
        type("Other", (type(side.store.consistency),), {})
    )
    assert side.serve(b"w0", _push(0, 0, 0, grad)) is None
    assert side.taken == 0 and side.store.chunks[0].pushes == 1
