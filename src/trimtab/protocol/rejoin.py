"""Headers of a coordinator's failover: REJOIN, a member telling a replacement
coordinator who it is and what it holds, and REJOINED, the coordinator's answer once
every member is back. One typed header, builder and reader each, as :mod:`.replica`
has them.

Who proves what (the transport's handshake has proven the job's secret both ways):

- A server's REJOIN carries its join ticket ``tk`` (as REGISTER does) and the job's
  member key ``mk`` masked by the server key and its nonce ``n``: only a coordinator
  holding the server key reads it. REJOINED's ``pf`` proves that coordinator holds the
  server key (:func:`~trimtab.runtime.credentials.coordinator_proof`).
- A worker's REJOIN carries ``pf``, an HMAC of its nonce under its credential, which only
  a holder of the member key can check; REJOINED's ``pf`` is the coordinator's HMAC of
  the same nonce under that credential. A worker never sends the credential itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Control, ErrorCode, Header, WireHeader, field, optional

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

_REJOIN = int(Control.REJOIN)
_REJOINED = int(Control.REJOINED)

#: Bytes of a REJOIN's nonce, and of each side's proof.
NONCE_BYTES = 16
PROOF_BYTES = 16
#: Bytes of the member key (as ``credentials.new_key`` makes it).
KEY_BYTES = 32


class RejoinHeader(WireHeader):
    """REJOIN, a member -> the coordinator that replaced a dead one."""

    role: str  # "server" or "worker"
    rank: int  # its index (a server) or rank (a worker) in the job
    n: bytes  # a fresh nonce
    addr: NotRequired[str]  # a server's address
    tk: NotRequired[bytes]  # a server's join ticket
    mk: NotRequired[bytes]  # a server's: the member key, masked (see the module)
    jm: NotRequired[dict[str, Any]]  # a server's job map: the newest it took
    mv: NotRequired[bool]  # a server's: chunks of a migration are on their way here or away
    ad: NotRequired[int]  # a server's: the newest adoption any of its chunks took (0: none)
    pf: NotRequired[bytes]  # a worker's proof of its credential
    lo: NotRequired[int]  # a worker's routing floor


def rejoin_server(
    *,
    rank: int,
    nonce: bytes,
    addr: str,
    masked_key: bytes,
    job_map: dict[str, Any],
    moving: bool,
    ticket: bytes | None,
    adopted: int = 0,
) -> RejoinHeader:
    header: RejoinHeader = {
        "o": _REJOIN,
        "i": 0,
        "role": "server",
        "rank": rank,
        "n": nonce,
        "addr": addr,
        "mk": masked_key,
        "jm": job_map,
        "mv": moving,
    }
    if ticket is not None:
        header["tk"] = ticket
    if adopted:
        header["ad"] = adopted
    return header


def rejoin_worker(*, rank: int, nonce: bytes, proof: bytes, floor: int) -> RejoinHeader:
    return {
        "o": _REJOIN,
        "i": 0,
        "role": "worker",
        "rank": rank,
        "n": nonce,
        "pf": proof,
        "lo": floor,
    }


def read_rejoin(header: Header) -> RejoinHeader:
    """A REJOIN, checked. Raises a MALFORMED :class:`ProtocolError` for an unknown role,
    a rank that is no index, a nonce, key or proof of the wrong size, or a missing or
    mistyped key of its role."""
    role = field(header, "role", str)
    rank = field(header, "rank", int)
    nonce = field(header, "n", bytes)
    if rank < 0 or len(nonce) != NONCE_BYTES:
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            f"REJOIN: 'rank' must be >= 0 and 'n' {NONCE_BYTES} bytes",
        )
    if role == "server":
        field(header, "addr", str)
        field(header, "jm", dict)
        field(header, "mv", bool)
        optional(header, "tk", bytes)
        if (optional(header, "ad", int) or 0) < 0:
            raise ProtocolError(ErrorCode.MALFORMED.value, "REJOIN: 'ad' must be >= 0")
        if len(field(header, "mk", bytes)) != KEY_BYTES:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"REJOIN: 'mk' must be {KEY_BYTES} bytes"
            )
    elif role == "worker":
        optional(header, "lo", int)
        if len(field(header, "pf", bytes)) != PROOF_BYTES:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"REJOIN: 'pf' must be {PROOF_BYTES} bytes"
            )
    else:
        raise ProtocolError(ErrorCode.MALFORMED.value, f"REJOIN: unknown role {role!r}")
    return cast(RejoinHeader, header)


class RejoinedHeader(WireHeader):
    """REJOINED, the replacement coordinator -> a member that rejoined: the job goes on
    under it (``pf``: its proof, see the module)."""

    pf: bytes


def rejoined(*, proof: bytes) -> RejoinedHeader:
    return {"o": _REJOINED, "i": 0, "pf": proof}


def read_rejoined(header: Header) -> RejoinedHeader:
    """A REJOINED, checked (MALFORMED :class:`ProtocolError` otherwise)."""
    field(header, "pf", bytes)
    return cast(RejoinedHeader, header)
