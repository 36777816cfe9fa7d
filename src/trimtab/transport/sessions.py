"""The handshakes and sessions of a :class:`~trimtab.transport.zmq.ZmqTransport`'s
ZeroMQ peers (the local lane runs its own, in :mod:`trimtab.transport.lane`).

A DEALER we open sends HELLO at once and queues what the node sends until the peer's
CHALLENGE proves it holds the secret; then PROOF and the queued messages leave, sealed.
A ROUTER peer (a ZeroMQ identity) is unknown until it sends HELLO and then a valid
PROOF: until then every other message from it is dropped unparsed and counted (ZeroMQ
offers no way to close one peer of a ROUTER; ZAP already keeps outsiders off it).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Collection

from trimtab.transport.auth import (
    CHALLENGE_BYTES,
    HELLO_BYTES,
    PROOF_BYTES,
    AuthRefused,
    ClientHandshake,
    JobKey,
    ServerHandshake,
    Session,
)
from trimtab.transport.base import Frame
from trimtab.transport.limits import Limits

log = logging.getLogger("trimtab.transport")

#: Handshakes begun and not finished that a node remembers (the oldest is forgotten).
MAX_UNPROVEN = 256


class ZmqSessions:
    """Sessions by DEALER address and by ROUTER identity. Not thread-safe: its
    transport's thread. Never blocks.

    Attributes:
        refused: messages (or connections) refused: unauthenticated, forged, replayed,
            or over the limits.
    """

    def __init__(self, key: JobKey | None, limits: Limits) -> None:
        self._key = key
        self._limits = limits
        self._out: dict[str, Session] = {}
        #: The sessions of our connections whose handshake is done (the same dict, never
        #: replaced): the transport's DEALER send and receive seal and open with them,
        #: without a call here.
        self.proven_out = self._out
        self._shaking_out: dict[str, ClientHandshake] = {}
        self._waiting: dict[str, list[list[Frame]]] = {}
        self._in: dict[bytes, Session] = {}
        #: The sessions of proven ROUTER identities (the same dict, never replaced): the
        #: transport's send seals a message to one with its session, without a call here
        #: (an identity without one never proved itself: its messages are dropped).
        self.proven_in = self._in
        self._shaking_in: collections.OrderedDict[bytes, ServerHandshake] = (
            collections.OrderedDict()
        )
        self.refused = 0
        #: A message of one frame, or two, of at most this many bytes in all is within
        #: every limit (:meth:`Limits.check_frames`' one test); 0: none is (each is
        #: checked in full). For the transport's receive of a proven peer's message.
        self.most_bytes = (
            min(limits.max_frame_bytes, limits.max_message_bytes) if limits.max_frames >= 2 else 0
        )

    def refuse(self, who: object, why: str) -> None:
        """Count a refusal; log the first one at warning level."""
        self.refused += 1
        level = logging.WARNING if self.refused == 1 else logging.DEBUG
        log.log(
            level, "refused a message from %r: %s (later refusals are logged at debug)", who, why
        )

    @property
    def waiting(self) -> bool:
        """Whether messages wait for a handshake to finish."""
        return any(self._waiting.values())

    def waiting_besides(self, skip: Collection[str]) -> bool:
        """Whether messages to an address not in ``skip`` wait for a handshake."""
        return any(frames for address, frames in self._waiting.items() if address not in skip)

    def established(self, address: str) -> bool:
        """Whether our connection to ``address`` finished its handshake (always, without
        a key: there is none)."""
        return self._key is None or address in self._out

    # -- our connections (DEALER) ------------------------------------------------------

    def opened(self, address: str) -> list[Frame] | None:
        """A DEALER to ``address`` was made: the HELLO to send on it first, if any."""
        if self._key is None:
            return None
        hs = ClientHandshake(self._key)
        self._shaking_out[address] = hs
        self._waiting[address] = []
        return [hs.hello]

    def forget(self, address: str) -> None:
        """Drop our session with ``address``, a handshake under way and what waits for
        it: the process there was replaced, and a new connection shakes hands anew."""
        self._out.pop(address, None)
        self._shaking_out.pop(address, None)
        self._waiting.pop(address, None)

    def seal_out(self, address: str, frames: list[Frame]) -> list[Frame] | None:
        """``frames`` as they go to ``address``, or None if they wait for the handshake."""
        if self._key is None:
            return frames
        session = self._out.get(address)
        if session is None:
            self._waiting[address].append(frames)
            return None
        return session.seal(frames)

    def on_dealer(
        self, address: str, frames: list[memoryview]
    ) -> tuple[list[memoryview] | None, list[list[Frame]]]:
        """A message from ``address``: (what the node receives, if anything; messages to
        send back, sealed)."""
        if self._key is None:  # (the data path's every message: _checked, inlined)
            why = self._limits.check_frames(frames)
            if why:
                self.refuse(address, why)
                return None, []
            return frames, []
        session = self._out.get(address)
        if session is not None:  # (_checked and _open, inlined: every data message)
            why = self._limits.check_frames(frames)
            if why:
                self.refuse(address, why)
                return None, []
            try:
                return session.open(frames), []
            except AuthRefused as exc:
                self.refuse(address, str(exc))
                return None, []
        hs = self._shaking_out.get(address)
        if hs is None or len(frames) != 1 or frames[0].nbytes != CHALLENGE_BYTES:
            self.refuse(address, "not a handshake")
            return None, []
        try:
            proof, session = hs.on_challenge(frames[0])
        except AuthRefused as exc:
            self.refuse(address, str(exc))
            return None, []
        del self._shaking_out[address]
        self._out[address] = session
        return None, [[proof], *(session.seal(m) for m in self._waiting.pop(address))]

    # -- peers that connected to us (ROUTER) ------------------------------------------

    def on_router(
        self, identity: bytes, frames: list[memoryview]
    ) -> tuple[list[memoryview] | None, list[Frame] | None]:
        """A message from ``identity``: (what the node receives, if anything; a
        handshake reply to send back)."""
        if self._key is None:  # (the data path's every message: _checked, inlined)
            why = self._limits.check_frames(frames)
            if why:
                self.refuse(identity, why)
                return None, None
            return frames, None
        session = self._in.get(identity)
        if session is not None:  # (_checked and _open, inlined: every data message)
            why = self._limits.check_frames(frames)
            if why:
                self.refuse(identity, why)
                return None, None
            try:
                return session.open(frames), None
            except AuthRefused as exc:
                self.refuse(identity, str(exc))
                return None, None
        size = frames[0].nbytes if len(frames) == 1 else -1
        try:
            hs = self._shaking_in.get(identity)
            if hs is None and size == HELLO_BYTES:
                hs = ServerHandshake(self._key)
                challenge = hs.on_hello(frames[0])
                self._shaking_in[identity] = hs
                if len(self._shaking_in) > MAX_UNPROVEN:
                    self._shaking_in.popitem(last=False)
                return None, [challenge]
            if hs is not None and size == PROOF_BYTES:
                del self._shaking_in[identity]
                self._in[identity] = hs.on_proof(frames[0])
                return None, None
            raise AuthRefused("not a handshake from a peer that has not proven the secret")
        except AuthRefused as exc:
            self.refuse(identity, str(exc))
            return None, None
