"""Members' credentials: who may send what, proved without a round trip.

The coordinator makes a random *member key* when it starts. Each member's credential
is an HMAC of the job, its role and its rank under that key (:func:`credential`); the
coordinator hands it to the member in REGISTERED, and the member key itself to every
server it admits. A worker puts its credential ``t`` (and its rank ``r``) into every
data request to a server; a server puts its own (and its index ``s``) into every
HANDOVER. A server checks one with a dict lookup and a constant-time compare
(:class:`Credentials`). The job id is no credential: anyone who can reach a socket
knows it.

A server joining a *running* job proves the launcher started it with a join ticket
(:func:`join_ticket`) made from the job's *server key*, which the coordinator and the
servers derive from the job's secret (or take from ``TRIMTAB_SERVER_KEY``; at the edge).

Standard library only (the coordinator imports no torch). Nothing here blocks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from typing import cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import ErrorCode, Header

#: Bytes of a credential: a truncated HMAC-SHA256 (128 bits), small enough for every push.
CREDENTIAL_BYTES = 16

#: Server indices whose credentials a server checks (a job never has more servers).
MAX_SERVERS = 4096
#: Worker ranks whose credentials a server checks (as many as a WORKERS may name).
MAX_WORKERS = 65536

WORKER = "worker"
SERVER = "server"


def new_key() -> bytes:
    """A fresh random member key (32 bytes)."""
    return secrets.token_bytes(32)


def credential(key: bytes, job: str, role: str, rank: int) -> bytes:
    """The credential of ``role`` number ``rank`` of ``job`` under ``key``."""
    message = f"{job}\0{role}\0{rank}".encode()
    return hmac.new(key, message, hashlib.sha256).digest()[:CREDENTIAL_BYTES]


def adoption_grant(key: bytes, job: str, root: int, number: int) -> bytes:
    """The grant of adoption ``number`` of worker ``root``'s values (ADOPT's reply)."""
    return credential(key, job, f"adopt{root}", number)


def join_ticket(server_key: bytes, job: str) -> bytes:
    """What a server started by the launcher shows in its REGISTER (``tk``)."""
    return credential(server_key, job, "join", 0)


def key_mask(server_key: bytes | None, job: str, nonce: bytes) -> bytes:
    """What a server's REJOIN masks the member key with (XOR, 32 bytes): an HMAC of its
    ``nonce`` under the job's server key, so that only a coordinator holding that key
    reads it; zeros in a job without a server key (no secret: nothing is secret)."""
    if not server_key:
        return bytes(32)
    return hmac.new(server_key, f"{job}\0mask\0".encode() + nonce, hashlib.sha256).digest()


def masked(key: bytes, mask: bytes) -> bytes:
    """``key`` XOR ``mask`` (both 32 bytes): masks, and unmasks."""
    return bytes(a ^ b for a, b in zip(key, mask, strict=True))


def rejoin_proof(secret: bytes, job: str, side: str, nonce: bytes) -> bytes:
    """One side's proof over a REJOIN's ``nonce``: an HMAC under ``secret`` (the server
    key, between a server and its coordinator; a worker's credential, between it and
    its coordinator) of the job, the side (``"coordinator"``, ``"worker"``) and the
    nonce, truncated to :data:`CREDENTIAL_BYTES`."""
    message = f"{job}\0rejoin\0{side}\0".encode() + nonce
    return hmac.new(secret, message, hashlib.sha256).digest()[:CREDENTIAL_BYTES]


def proven(shown: object, expected: bytes) -> bool:
    """Whether ``shown`` is the bytes ``expected`` (compared in constant time)."""
    return isinstance(shown, bytes) and hmac.compare_digest(shown, expected)


def admit_server(ticket: bytes | None, header: Header, *, running: bool) -> None:
    """Whether a would-be server's REGISTER may go on to the coordinator's members (which
    check the job wants one): it must show the job's join ``ticket`` (``tk``) or, in a
    job without a server key (``ticket`` None), come before the job is placed (only the
    servers it starts join then). Raises a FORBIDDEN :class:`ProtocolError` otherwise."""
    if ticket is not None:
        shown = header.get("tk")
        if not isinstance(shown, bytes) or not hmac.compare_digest(shown, ticket):
            raise forbidden(
                "a server needs the join ticket of this job's server key to register "
                "(derived from the job's secret file, or TRIMTAB_SERVER_KEY)"
            )
    elif running:
        raise forbidden(
            "this job has no server key (no secret, no TRIMTAB_SERVER_KEY): no server "
            "may join it once it is placed"
        )


def forbidden(msg: str) -> ProtocolError:
    """A FORBIDDEN :class:`ProtocolError` saying ``msg``."""
    return ProtocolError(ErrorCode.FORBIDDEN.value, msg)


class Credentials:
    """A server's check of who sent a data message. Not thread-safe: the server's loop
    owns it. Until :meth:`learn` every credential is refused."""

    def __init__(self, job: str) -> None:
        self.job = job
        self._key: bytes | None = None
        self._workers: dict[int, bytes] = {}
        self._servers: dict[int, bytes] = {}
        #: This server's own credential (for its HANDOVERs), once registered.
        self.own: bytes | None = None

    def learn(self, key: bytes, num_workers: int, own: bytes | None) -> None:
        """Take the member key and the job's worker count from REGISTERED."""
        self._key = key
        self._workers = {r: credential(key, self.job, WORKER, r) for r in range(num_workers)}
        self._servers = {}
        self.own = own

    @property
    def key(self) -> bytes | None:
        """The member key, once learned."""
        return self._key

    def admit(self, ranks: Iterable[int]) -> None:
        """Take the credentials of worker ``ranks`` too (workers that joined the running
        job, beyond its first count). Nothing before :meth:`learn`."""
        if self._key is not None:
            for r in ranks:
                self._workers.setdefault(r, credential(self._key, self.job, WORKER, r))

    def worker(self, header: Header) -> int:
        """The worker rank ``r`` whose credential ``t`` ``header`` carries. Raises a
        FORBIDDEN :class:`ProtocolError` if it carries none or a wrong one."""
        rank: int = header.get("r", -1)  # (checked below; no cast call a push)
        token = header.get("t")
        expected = self._workers.get(rank) if type(rank) is int else None
        key = self._key
        if expected is None and key is not None and type(rank) is int and 0 <= rank < MAX_WORKERS:
            # A rank the job gave a worker that joined it (the coordinator issued its
            # credential): a server that joined later never heard of it (WORKERS came
            # before), yet must take its pushes.
            expected = self._workers[rank] = credential(key, self.job, WORKER, rank)
        if expected is None or type(token) is not bytes or not hmac.compare_digest(token, expected):
            raise forbidden(
                f"op {header.get('o')} needs a worker's credential: 't' and the rank 'r' it "
                "was issued for (its REGISTERED gives a worker both)"
            )
        return rank

    def adoption(self, header: Header, root: int) -> int:
        """The adoption number ``ad`` of an INIT of worker ``root`` whose grant ``g`` is
        the coordinator's. Raises a FORBIDDEN :class:`ProtocolError` otherwise."""
        number = header.get("ad")
        grant = header.get("g")
        key = self._key
        if (
            key is None
            or type(number) is not int
            or type(grant) is not bytes
            or not hmac.compare_digest(grant, adoption_grant(key, self.job, root, number))
        ):
            raise forbidden(
                "an INIT after declaration needs the grant of an adoption every worker "
                "asked the coordinator for (ADOPT)"
            )
        return number

    def server(self, header: Header) -> int:
        """The server index ``s`` whose credential ``t`` ``header`` carries. Raises a
        FORBIDDEN :class:`ProtocolError` if it carries none or a wrong one."""
        index = header.get("s")
        token = header.get("t")
        key = self._key
        if key is None or type(index) is not int or not 0 <= index < MAX_SERVERS:
            expected = None
        else:
            expected = self._servers.get(index)
            if expected is None:
                expected = self._servers[index] = credential(key, self.job, SERVER, index)
        if expected is None or type(token) is not bytes or not hmac.compare_digest(token, expected):
            raise forbidden(
                f"op {header.get('o')} is a server's: it needs the sender's index 's' and "
                "its credential 't'"
            )
        return cast(int, index)
