"""trimtab's exception tree.

Every error trimtab raises derives from :class:`TrimtabError`::

    TrimtabError
    ├── RetryableError            the operation can succeed if tried again
    │   └── ChunkMoved            a server no longer owns a chunk: refresh routing, retry
    └── FatalError                retrying will not help
        ├── ConfigError           a setting is wrong; the message says which and how to fix it
        ├── UsageError            the API was called out of order (Horovod's contract)
        ├── ProtocolError         a peer sent something out of protocol
        │   └── RemoteError       a peer refused our request; carries its error code
        ├── JobAborted            the job was torn down (a node died, Ctrl-C, teardown)
        └── NodeTimeout           a peer did not answer in time

Callers that only want to know "should I retry?" catch :class:`RetryableError`.
"""

from __future__ import annotations


class TrimtabError(Exception):
    """Base class of every error trimtab raises."""


class RetryableError(TrimtabError):
    """The operation may succeed if tried again (after refreshing state)."""


class ChunkMoved(RetryableError):
    """A server was asked about a chunk it does not own.

    Attributes:
        chunk: the chunk id.
        owner: the owner the server believes in (a server index), or -1 if unknown.
        epoch: the placement epoch the server knows.
    """

    def __init__(self, chunk: int, owner: int, epoch: int) -> None:
        super().__init__(
            f"chunk {chunk} is owned by server {owner} as of placement epoch {epoch}; "
            "refresh the placement map and retry"
        )
        self.chunk = chunk
        self.owner = owner
        self.epoch = epoch


class FatalError(TrimtabError):
    """Retrying will not help."""


class ConfigError(FatalError, ValueError):
    """A setting is invalid. The message names the setting and what to do."""


class UsageError(FatalError, RuntimeError):
    """The API was used out of order, e.g. ``zero_grad()`` between backward and step."""


class ProtocolError(FatalError):
    """A message broke the protocol (malformed, oversized, wrong job, wrong type)."""


class RemoteError(ProtocolError):
    """A peer answered our request with an error.

    Attributes:
        code: the machine-readable error code (see ``trimtab.protocol.messages.ErrorCode``).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code


class JobAborted(FatalError):
    """The job is over: a node died, the user interrupted it, or it was torn down."""


class NodeTimeout(FatalError, TimeoutError):
    """A peer did not answer within the allowed time."""
