"""What a worker's data requests end with: a :class:`Reply`, or, where a server cannot
map this worker's shared memory, :class:`SharedMemoryRefused`; and the futures that
carry them (:class:`DataFuture`, :func:`wait`)."""

from __future__ import annotations

import concurrent.futures
from typing import NamedTuple, Protocol

from trimtab.errors import NodeTimeout, RetryableError
from trimtab.protocol.messages import ErrorCode, Header


class SharedMemoryRefused(RetryableError):
    """A server cannot map this worker's shared memory (another machine, another
    ``/dev/shm``): send it the push's bytes instead, and from then on. Recovered from
    where pushes are sent; not an error of the job.

    Attributes:
        code: ``no_shm``, the code the server answered.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode.NO_SHM.value


class Reply(NamedTuple):
    """A reply: its header, its buffers (which stay valid while referenced), and when
    this process read it off its socket (``time.perf_counter()``)."""

    header: Header
    frames: list[memoryview]
    at: float = 0.0


class Receiver(Protocol):
    """What reads a data request's reply off the sockets while a thread waits for it
    (a :class:`~trimtab.roles.worker.client.WorkerClient`)."""

    def drive(self, fut: DataFuture, timeout_s: float) -> None:
        """Receive until ``fut`` is done or ``timeout_s`` passed. Blocks; never raises."""


class DataFuture(concurrent.futures.Future[Reply]):
    """The future of a data request: waiting for it receives on the data sockets.
    ``epoch`` is the placement epoch the request was routed by (its header's ``e``: an
    int in a PUSH, PULL or INIT, absent from a STATS); ``address`` the server's, and
    ``chunk`` the request's ``c`` (-1 for none), for a failover to fail it as moved."""

    def __init__(self, client: Receiver, epoch: object, address: str, chunk: object) -> None:
        super().__init__()
        self.client = client
        self.epoch = epoch
        self.address = address
        self.chunk = chunk if isinstance(chunk, int) else -1


def wait(future: concurrent.futures.Future[Reply], timeout_s: float) -> Reply:
    """Block until ``future`` is done; return its reply. For a data request, the calling
    thread receives replies itself meanwhile (and completes others' futures too).

    Raises the remote error (:class:`RemoteError`, :class:`ChunkMoved`,
    :class:`SharedMemoryRefused`), :class:`JobAborted`, or :class:`NodeTimeout` after ``timeout_s``.
    """
    if isinstance(future, DataFuture):
        future.client.drive(future, timeout_s)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise NodeTimeout(f"no reply within {timeout_s:.0f}s; is the job still running?") from None
