"""What the coordinator's pieces return instead of sending: the messages for
:mod:`trimtab.roles.coordinator.node` to send, in order (elastic's operation and
executor split), so that each piece is tested without threads or sockets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from trimtab.protocol.messages import Header, WireHeader
from trimtab.transport.base import Frame, Peer


class Send(NamedTuple):
    """A message to send: ``header`` (a builder's typed header of
    :mod:`trimtab.protocol.headers`; the job id is added on sending) and its frames."""

    peer: Peer
    header: Header | WireHeader
    frames: Sequence[Frame] = ()


class Refuse(NamedTuple):
    """An ERROR reply to request ``rid`` of ``peer``, with an ``ErrorCode`` value."""

    peer: Peer
    rid: int
    code: str
    msg: str


#: The messages one operation produced, to be sent in this order.
Outbox = list[Send | Refuse]
