"""The raw clients of the role tests: a peer that passes the transport's checks but holds
no role in the job (an insider without a credential), sending hand-made messages.

Every such client in the tests comes from :func:`raw_client`, so that whatever the
transport asks of a peer of the job (its secret, a handshake) is added here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from trimtab.protocol.messages import encode
from trimtab.transport import ZmqTransport
from trimtab.transport.auth import JobKey, read_secret_file


class RawClient:
    """One connection to a node, from a fresh transport. Not thread-safe."""

    def __init__(self, address: str, key: JobKey) -> None:
        self._transport = ZmqTransport(bind=False, lane=False, reuse_buffers=False, auth=key)
        self._peer = self._transport.connect(address)

    def send(self, header: dict[str, Any], frames: Sequence[bytes | memoryview] = ()) -> None:
        """Send ``header`` (encoded as is) and ``frames``. Does not block."""
        self._transport.send(self._peer, [encode(header), *frames])

    def reply(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """The next reply's header. Blocks up to ``timeout_s``; raises ``AssertionError``
        if none came (a node must answer a refused request)."""
        env = self._transport.recv(timeout_s)
        assert env is not None, "no reply: a refused request must be answered"
        header = msgpack.unpackb(env.frames[0])
        assert isinstance(header, dict)
        return header

    def request(
        self, header: dict[str, Any], frames: Sequence[bytes | memoryview] = ()
    ) -> dict[str, Any]:
        """Send, then wait for the reply's header (as :meth:`reply`)."""
        self.send(header, frames)
        return self.reply()

    def close(self) -> None:
        """Close the connection. Idempotent."""
        self._transport.close()


def raw_client(address: str, secret_file: str) -> RawClient:
    """A client of the node at ``address`` that passes the transport's checks (it holds
    the job's secret, from ``secret_file``) but holds no role in the job."""
    return RawClient(address, JobKey(read_secret_file(secret_file)))
