"""A worker's credit for its pushes: a push's CREDIT returns its bytes to the window,
and so does its reply where no CREDIT came first (an error, say), from the server it
was sent to only; a reply after its CREDIT changes nothing."""

from __future__ import annotations

import pytest

from trimtab.protocol import headers
from trimtab.protocol.credit import credit
from trimtab.protocol.messages import encode
from trimtab.roles.worker.client import WorkerClient
from trimtab.roles.worker.config import WorkerConfig
from trimtab.transport.inproc import Fabric

JOB = "credit-job"
CHUNK = 64

pytestmark = pytest.mark.timeout(60)


def a_client() -> tuple[WorkerClient, str, bytes, bytes]:
    """A client (not started) with a window of one chunk; returns it, a server's
    address, that server's peer and another server's peer, as the client names them."""
    fabric = Fabric()
    coordinator, server, other = fabric.transport(), fabric.transport(), fabric.transport()
    client = WorkerClient(
        WorkerConfig(coordinator=coordinator.address, job=JOB, credit_bytes=CHUNK),
        fabric.transport(),
    )
    client.rank, client.credential = 0, b"t"
    peer, stranger = client._data.connect(server.address), client._data.connect(other.address)
    return client, server.address, peer, stranger


def push(client: WorkerClient, address: str, chunk: int) -> int:
    """Push a chunk's gradient of :data:`CHUNK` bytes to ``address``; its request id."""
    header = headers.push(
        chunk=chunk, epoch=1, dtype="float32", numel=CHUNK // 4, rank=0, clock=1, weight=1.0,
        version=0, hp=None, empty=False, mean_only=False,
    )  # fmt: skip
    client.request(address, header, [memoryview(bytes(CHUNK))])
    return int(header["i"])


def value(rid: int) -> list[memoryview]:
    header = headers.value(rid=rid, chunk=0, version=1, round=2, numel=CHUNK // 4, dtype="float32")
    return [memoryview(encode({**header, "j": JOB})), memoryview(bytes(CHUNK))]


def credit_of(rid: int) -> list[memoryview]:
    return [memoryview(encode({**credit(rid=rid), "j": JOB}))]


def test_a_reply_credits_its_push_where_no_credit_came_first() -> None:
    client, address, peer, _ = a_client()
    gate = client.credit
    assert gate is not None
    first, second = push(client, address, 0), push(client, address, 1)
    assert gate.in_flight(address) == CHUNK and gate.stats.held == 1  # the second waits
    client._on_message(peer, value(first))  # no CREDIT came: the value credits it
    assert gate.in_flight(address) == CHUNK and gate.outstanding == 1  # the second went
    assert any(to == address for to, _ in client._data_out)
    client._on_message(peer, value(second))
    assert gate.in_flight(address) == 0 and gate.outstanding == 0
    assert not client._uncredited


def test_a_credit_or_reply_from_another_server_credits_nothing() -> None:
    client, address, peer, stranger = a_client()
    gate = client.credit
    assert gate is not None
    rid = push(client, address, 0)
    client._on_message(stranger, credit_of(rid))
    assert gate.in_flight(address) == CHUNK and client._uncredited == {rid: address}
    client._on_message(peer, credit_of(rid))
    assert gate.in_flight(address) == 0 and not client._uncredited


def test_a_reply_after_its_credit_changes_nothing() -> None:
    client, address, peer, _ = a_client()
    gate = client.credit
    assert gate is not None
    first, second = push(client, address, 0), push(client, address, 1)
    client._on_message(peer, credit_of(first))  # releases the second
    assert gate.in_flight(address) == CHUNK and gate.outstanding == 1
    client._on_message(peer, value(first))  # credited already: the second stays in flight
    assert gate.in_flight(address) == CHUNK and gate.outstanding == 1
    assert client._uncredited == {second: address}
