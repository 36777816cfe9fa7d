"""The worker client's receive path (``_on_message``), fuzzed in process: whatever a
coordinator or server peer sends, nothing escapes; a reply completes only the request
it names, with a value or one of the documented errors; only the coordinator can end
the job for the worker."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.strategies import frames, headers_of, values
from trimtab.errors import ChunkMoved, JobAborted, ProtocolError, RemoteError
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, Data, encode
from trimtab.roles.worker.client import WorkerClient
from trimtab.roles.worker.config import WorkerConfig
from trimtab.roles.worker.replies import Reply, SharedMemoryRefused
from trimtab.transport import Fabric

JOB = "fuzz"
OPS = [int(op) for op in (*Control, *Data)]
SERVER = "inproc://a-server"

pytestmark = pytest.mark.timeout(120)


def a_client() -> tuple[WorkerClient, list[Any], bytes, bytes]:
    """A client (not started: no I/O thread) with three data requests and one control
    request in flight; returns it, the futures, the coordinator's and a server's peer."""
    fabric = Fabric()
    coordinator = fabric.transport()
    client = WorkerClient(
        WorkerConfig(coordinator=coordinator.address, job=JOB), fabric.transport()
    )
    futures = [client.request(SERVER, headers.pull(chunk=c, epoch=1)) for c in range(3)]
    futures.append(client.control(headers.barrier(name="b")))
    return client, futures, client._coord, client._data.connect(SERVER)


plausible = {
    "c": st.integers(-1, 3) | values,
    "s": st.integers(-1, 3) | values,
    "e": st.integers(0, 3) | values,
    "v": st.integers(0, 3) | values,
    "k": st.integers(0, 3) | values,
    "n": st.integers(0, 8) | values,
    "dt": st.sampled_from(["float32", "bfloat16", "x"]) | values,
    "b": st.binary(max_size=40) | values,
    "sm": st.integers(0, 2) | values,
    "z": st.booleans() | values,
    "code": st.sampled_from(["no_shm", "bad_state", "forbidden"]) | values,
    "msg": st.text(max_size=10) | values,
    "why": st.text(max_size=10) | values,
}


@st.composite
def replies(draw: st.DrawFn) -> tuple[bool, dict[str, Any], list[bytes]]:
    header: dict[str, Any] = {
        "o": draw(st.sampled_from(OPS) | st.integers(-3, 100)),
        "j": JOB,
        "i": draw(st.sampled_from([1, 2, 3, 4, 0, 99]) | st.integers()),
    }
    for key in draw(st.lists(st.sampled_from(sorted(plausible)), max_size=6, unique=True)):
        header[key] = draw(plausible[key])
    if draw(st.integers(0, 4)) == 0:
        header.update(draw(headers_of(JOB)))
    return draw(st.booleans()), header, draw(frames([16, 32]))


@given(st.lists(replies(), min_size=1, max_size=6))
def test_whatever_arrives_the_worker_goes_on(messages: list[Any]) -> None:
    client, futures, coord, server = a_client()
    ended = False  # the coordinator may end the job (ABORT, SHUTDOWN)
    for from_coord, header, fs in messages:
        try:
            wire = encode(header)
        except (TypeError, ValueError, OverflowError):
            continue
        client._on_message(coord if from_coord else server, [memoryview(wire), *fs])
        ended = ended or (from_coord and client.dead is not None)
        if not ended:
            assert client.dead is None, "a server ended the job for a worker"
    for fut in futures:
        if not fut.done():
            continue
        exc = fut.exception()
        if exc is None:
            assert isinstance(fut.result(), Reply)
        else:
            allowed = (RemoteError, SharedMemoryRefused, ChunkMoved, ProtocolError, JobAborted)
            assert isinstance(exc, allowed), repr(exc)


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    logger = logging.getLogger("trimtab")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
