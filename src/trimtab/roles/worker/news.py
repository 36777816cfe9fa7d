"""The newest placement map a worker's coordinator published and sent unasked (MAP_NEWS,
as a migration's map is published), until the worker's next step takes it."""

from __future__ import annotations

import logging
import threading

from trimtab.errors import ProtocolError
from trimtab.protocol.headers import MapReplyHeader
from trimtab.protocol.messages import Header
from trimtab.protocol.prefetch import read_map_news

log = logging.getLogger("trimtab.worker")


class MapNews:
    """The newest MAP_NEWS not yet taken. Thread-safe; never blocks (beyond a short
    lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._news: MapReplyHeader | None = None

    def keep(self, header: Header) -> None:
        """A MAP_NEWS: kept if newer than the one kept; a malformed one is dropped (a
        routing hint: without it, chunks answer moved)."""
        try:
            news = read_map_news(header)
        except ProtocolError as exc:
            log.error("dropped a malformed MAP_NEWS: %s", exc)
            return
        with self._lock:
            if self._news is None or news["epoch"] > self._news["epoch"]:
                self._news = news

    def take(self) -> MapReplyHeader | None:
        """The newest map kept since the last call, or None."""
        with self._lock:
            news, self._news = self._news, None
        return news
