"""MAP_NEWS: a published map sent to the workers unasked, so that they route the step
after a migration's cut by it rather than learn it from *moved* answers (issue 20's
migration pause).

As in :mod:`trimtab.protocol.placement`: the builder checks nothing, the reader checks
a received header's keys and returns it typed, or raises
``ProtocolError(ErrorCode.MALFORMED.value, ...)``. Neither blocks; both are thread-safe.
"""

from __future__ import annotations

from trimtab.protocol.messages import Control, Header
from trimtab.protocol.placement import MapReplyHeader, read_map_reply

_MAP_NEWS = int(Control.MAP_NEWS)


def map_news(published: MapReplyHeader) -> MapReplyHeader:
    """The published map (MAP's answer to MAP_GET) as MAP_NEWS: the same keys, no
    request id to answer (``i`` 0)."""
    news = published.copy()
    news["o"] = _MAP_NEWS
    news["i"] = 0
    return news


def read_map_news(header: Header) -> MapReplyHeader:
    """Checks the keys MAP answering MAP_GET has (``epoch``, ``owners``, ``servers``,
    ``prev``, ``cuts``) and their types, as :func:`read_map_reply`."""
    return read_map_reply(header)
