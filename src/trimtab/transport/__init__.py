"""Transports: how nodes exchange framed messages.

:class:`Transport` is the contract; :class:`ZmqTransport` is the real one (ZeroMQ over
TCP), :class:`InprocTransport` an in-memory one for unit tests and the simulator.
"""

from trimtab.transport.base import Envelope, Frame, Peer, Transport, in_peer, out_peer
from trimtab.transport.inproc import Fabric, InprocTransport
from trimtab.transport.zmq import ZmqTransport

__all__ = [
    "Envelope",
    "Fabric",
    "Frame",
    "InprocTransport",
    "Peer",
    "Transport",
    "ZmqTransport",
    "in_peer",
    "out_peer",
]
