"""A member's side of its coordinator's failover, shared by servers and workers.

When the coordinator's connection closes or it falls silent, a member that is part of a
running job does not end: it reconnects to the same address (where the launcher starts
a replacement, :mod:`trimtab.roles.coordinator.rejoin`), sends REJOIN once per
connection, and goes on with its data path meanwhile. The replacement's REJOINED must
prove the secret the member checks (:func:`~trimtab.runtime.credentials.rejoin_proof`);
then the job goes on under it. With no replacement within ``timeout_s`` (the
coordinator timeout), the member gives up as it did before failover existed.

Not thread-safe: its member's loop (a server's, a worker's I/O thread) uses it. Never
blocks.
"""

from __future__ import annotations

import logging
import secrets
import time

from trimtab.protocol.rejoin import NONCE_BYTES
from trimtab.runtime import credentials

log = logging.getLogger("trimtab.rejoin")


class Rejoin:
    """Whether the member is away from a coordinator, since when, and its nonce.

    Args:
        job: the job's id.
        timeout_s: how long to wait for a replacement coordinator.
    """

    def __init__(self, job: str, timeout_s: float) -> None:
        self.job = job
        self.timeout_s = timeout_s
        self.since: float | None = None
        self.why = ""
        #: This outage's nonce (a REJOIN's ``n``).
        self.nonce = b""
        #: Coordinators that replaced a dead one for this member so far.
        self.failovers = 0

    @property
    def away(self) -> bool:
        """Whether the member waits for a replacement coordinator."""
        return self.since is not None

    def begin(self, why: str) -> None:
        """The coordinator is gone (``why``): wait for a replacement, with a new nonce.
        A replacement that died too starts the wait over."""
        if self.since is None:
            self.since = time.monotonic()
            log.warning("%s: waiting up to %.0fs for a replacement", why, self.timeout_s)
        self.why = why
        self.nonce = secrets.token_bytes(NONCE_BYTES)

    def late(self) -> str | None:
        """Why to give up, once no replacement came within ``timeout_s``; else None."""
        if self.since is None or time.monotonic() - self.since <= self.timeout_s:
            return None
        return f"{self.why}, and no coordinator replaced it within {self.timeout_s:.0f}s"

    def end(self, shown: object, secret: bytes) -> bool:
        """A REJOINED whose proof is ``shown``: True (the wait is over) if it proves
        ``secret`` over this outage's nonce; False (it is ignored) otherwise."""
        expected = credentials.rejoin_proof(secret, self.job, "coordinator", self.nonce)
        if self.since is None or not credentials.proven(shown, expected):
            log.warning("ignored a REJOINED without a valid proof of the job's secret")
            return False
        log.warning(
            "a new coordinator took over after %.1fs; the job goes on",
            time.monotonic() - self.since,
        )
        self.since = None
        self.failovers += 1
        return True
