"""What a worker's data requests end with: a :class:`Reply`, or, where a server cannot
map this worker's shared memory, :class:`SharedMemoryRefused`."""

from __future__ import annotations

from typing import NamedTuple

from trimtab.errors import RetryableError
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
