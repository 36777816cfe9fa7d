"""CREDIT, both ways: a message's bytes were received (P3).

* server -> worker: a worker that bounds the bytes it has in flight to each server marks
  its pushes ``ak``; the server answers each such push with a CREDIT as soon as it reads
  the push off its socket, before merging or answering it, and the worker sends its next
  held push. Credit returns on receipt, not on the reply: under BSP a reply waits for
  every worker's push, so a credit that waited for it would let one worker's held-back
  pushes stall another's replies (:mod:`trimtab.runtime.credit`).
* worker -> server: such a push also says how many bytes of values the worker takes in
  flight (``vk``); the server marks the values it counts ``ak``, and the worker answers
  each with a CREDIT as it reads it, which releases the server's held values.

One builder and one reader, as :mod:`.data` has them; none blocks, all are thread-safe.
"""

from __future__ import annotations

from typing import cast

import msgpack

from trimtab.protocol.messages import Data, Header, WireHeader, encode, fields

_CREDIT = int(Data.CREDIT)


class CreditHeader(WireHeader):
    """CREDIT: the push (server -> worker), or the value (worker -> server), of request
    ``i`` was received. No reply; a push's own reply (VALUE, MOVED or ERROR) follows as
    usual."""


def credit(*, rid: int) -> CreditHeader:
    return {"o": _CREDIT, "i": rid}


class CreditFrames:
    """The encoded CREDIT of job ``job``, one a message: what :func:`credit`, stamped
    with ``j`` and encoded, gives, for the bytes of the rid alone (a CREDIT a chunk each
    way is the commonest message of a step). Thread-safe; never blocks."""

    def __init__(self, job: str) -> None:
        # A map of 3 (0x83) whose last key is "i": the rid's msgpack integer follows.
        head = encode({"o": _CREDIT, "j": job})
        self._head = bytes([0x83]) + head[1:] + b"\xa1i"  # ("i": a fixstr of 1)

    def __call__(self, rid: int) -> bytes:
        """The CREDIT of request ``rid``, encoded (decodes as ``credit(rid=rid)`` with
        ``j``)."""
        packed: bytes = msgpack.packb(rid)
        return self._head + packed


def read_credit(header: Header) -> CreditHeader:
    fields(header, (("i", int),))
    return cast(CreditHeader, header)
