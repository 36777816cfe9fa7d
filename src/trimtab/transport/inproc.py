"""An in-memory transport for unit tests and the cluster simulator.

Nodes on one :class:`Fabric` reach each other by address. Frames are copied on send,
as a network would, so a test cannot pass by accident through shared memory.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Sequence

from trimtab.transport.base import Envelope, Frame, Peer, Transport, in_peer, out_peer

_WAKE = object()


class Fabric:
    """The "network" that in-process transports share. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, InprocTransport] = {}
        self._ids = itertools.count()

    def transport(self, *, bind: bool = True) -> InprocTransport:
        """A new transport on this fabric, with a fresh address if ``bind``."""
        with self._lock:
            address = f"inproc://node-{next(self._ids)}"
            node = InprocTransport(self, address, bind)
            self._nodes[address] = node
            return node

    def _deliver(self, to: str, envelope: Envelope) -> None:
        with self._lock:
            node = self._nodes.get(to)
        if node is not None:  # like TCP to a closed port: the message is lost
            node._inbox.put(envelope)

    def _remove(self, address: str) -> None:
        with self._lock:
            self._nodes.pop(address, None)


class InprocTransport(Transport):
    """A :class:`Transport` over a :class:`Fabric`."""

    def __init__(self, fabric: Fabric, address: str, bind: bool) -> None:
        self._fabric = fabric
        self._own = address
        self._bind = bind
        self._inbox: queue.SimpleQueue[Envelope | object] = queue.SimpleQueue()

    @property
    def address(self) -> str:
        return self._own if self._bind else ""

    def connect(self, address: str) -> Peer:
        return out_peer(address)

    def send(self, peer: Peer, frames: Sequence[Frame]) -> None:
        copied = [memoryview(bytes(f)) for f in frames]
        target = peer[2:].decode()
        # The receiver sees us as an inbound peer if we connected out, and vice versa.
        sender = in_peer(self._own.encode()) if peer.startswith(b"o:") else out_peer(self._own)
        self._fabric._deliver(target, Envelope(sender, copied))

    def recv(self, timeout_s: float | None) -> Envelope | None:
        try:
            item = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return item if isinstance(item, Envelope) else None

    def wake(self) -> None:
        self._inbox.put(_WAKE)

    def companion(self) -> InprocTransport:
        return self._fabric.transport(bind=False)

    def close(self) -> None:
        self._fabric._remove(self._own)
