"""CREDIT, server -> worker: a push's bytes were received (P3's send side).

A worker that bounds the bytes it has in flight to each server marks its pushes ``ak``;
the server answers each such push with a CREDIT as soon as it reads the push off its
socket, before merging or answering it, and the worker sends its next held push. Credit
returns on receipt, not on the reply: under BSP a reply waits for every worker's push,
so a credit that waited for it would let one worker's held-back pushes stall another's
replies (:mod:`trimtab.roles.worker.credit`). One builder and one reader, as
:mod:`.data` has them; none blocks, all are thread-safe.
"""

from __future__ import annotations

from typing import cast

from trimtab.protocol.messages import Data, Header, WireHeader, fields

_CREDIT = int(Data.CREDIT)


class CreditHeader(WireHeader):
    """CREDIT, server -> worker: the push of request ``i`` was received. No reply; the
    push's own reply (VALUE, MOVED or ERROR) follows as usual."""


def credit(*, rid: int) -> CreditHeader:
    return {"o": _CREDIT, "i": rid}


def read_credit(header: Header) -> CreditHeader:
    fields(header, (("i", int),))
    return cast(CreditHeader, header)
