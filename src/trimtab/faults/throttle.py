"""A slow server, emulated around it: a :class:`ThrottledTransport` paces what a server
receives and sends as its straggler specs say (``server:I:bandwidth=...``,
``server:I:delay=...``, ``server:I:cpu=...``), so the server role itself knows nothing
of fault injection. ``trimtab server`` wires it in when ``--straggler`` names servers::

    transport = ThrottledTransport(server_transport(config), specs, config.job, config.coordinator)
    server = Server(config, transport)
    transport.follow(server)

What is paced is what the server handles: every message from a worker or another
server (its frames, plus the gradient a push left in shared memory), and every value it
sends (inline, as a frame or into shared memory), at the same rate per byte as the
schedule (:class:`~trimtab.faults.stragglers.ServerStraggler`). Traffic with the
coordinator is not paced. The time slept counts as the server's busy time
(:meth:`Paced.stalled`), so PSLD's speed figure sees the slowness.

While its link is paced, a throttled server takes one message at a time
(:meth:`ThrottledTransport.recv_queued` holds nothing, so it orders no batch by
priority): each is paced before the server sees it, as a slow link delivers them, and
replies leave as soon as each is handled rather than after a whole window of queued
pushes has been paced. Outside its windows, and for every server no spec names, the
inner transport's batching is untouched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ProtocolError
from trimtab.faults.stragglers import ServerStraggler, StragglerSpec
from trimtab.protocol import headers
from trimtab.protocol.messages import Data, Header, decode
from trimtab.transport import Envelope, Frame, Peer, Transport, out_peer


class Paced(Protocol):
    """The node a :class:`ThrottledTransport` paces: its index picks its specs (-1
    until known, e.g. before a server registered), its step their windows, and its busy
    time takes the pauses."""

    @property
    def index(self) -> int: ...

    @property
    def step(self) -> int: ...

    def stalled(self, seconds: float) -> None: ...


class ThrottledTransport(Transport):
    """A :class:`Transport` that paces another as a slower server's link would.

    Args:
        inner: the transport that moves the bytes (closed with this one).
        specs: straggler specs; those naming the followed node's index apply.
        job: the job id, to read the headers it paces.
        coordinator: the coordinator's address, whose traffic is never paced.

    Until :meth:`follow` names the node, nothing is paced. Threading as
    :class:`Transport`: the node's loop calls everything but :meth:`wake`. ``recv`` and
    ``send`` block for the pause on top of the inner transport's own blocking.
    """

    def __init__(
        self, inner: Transport, specs: Sequence[StragglerSpec], job: str, coordinator: str
    ) -> None:
        self._inner = inner
        self._specs = tuple(specs)
        self._job = job
        self._coord = out_peer(coordinator)
        self._node: Paced | None = None
        self._index = -1
        self._schedule = ServerStraggler((), -1)
        self._step = 0

    @property
    def spin_s(self) -> float:
        return self._inner.spin_s

    @spin_s.setter
    def spin_s(self, value: float) -> None:
        self._inner.spin_s = value

    def follow(self, node: Paced) -> None:
        """Pace for ``node`` from now on. Not thread-safe; call before the node runs."""
        self._node = node

    def _active(self) -> ServerStraggler | None:
        """The schedule of the followed node, brought up to its index and step."""
        node = self._node
        if node is None:
            return None
        if node.index != self._index:
            self._schedule.close()
            self._index = node.index
            self._schedule = ServerStraggler(self._specs, self._index)
            if self._index >= 0 and not self._schedule:
                self._node = None  # registered, and no spec names it: nothing to pace, ever
        if not self._schedule:
            return None
        step = node.step
        if step > self._step:  # competing processes start and stop with the step
            self._step = step
            self._schedule.on_step(step)
        return self._schedule

    @property
    def address(self) -> str:
        return self._inner.address

    def connect(self, address: str) -> Peer:
        return self._inner.connect(address)

    def reconnect(self, address: str) -> Peer:
        return self._inner.reconnect(address)

    def send(self, peer: Peer, frames: Sequence[Frame]) -> None:
        schedule = self._active()
        if schedule is not None and peer != self._coord:
            nbytes = _value_bytes(frames, self._job)
            if nbytes:
                # Sent from within the server's handling of a message, already busy time.
                schedule.on_bytes(nbytes, self._step)
        self._inner.send(peer, frames)

    def send_to(self, address: str, frames: Sequence[Frame]) -> None:
        self.send(self.connect(address), frames)  # (each value paced)

    def recv(self, timeout_s: float | None) -> Envelope | None:
        env = self._inner.recv(timeout_s)
        self._received(env)
        return env

    def recv_queued(self) -> Envelope | None:
        """Nothing while the link is paced: it hands over one message at a time (see
        the module). Otherwise the inner transport's."""
        schedule = self._active()
        if schedule is not None and any(
            s.kind != "cpu" and s.active(self._step) for s in schedule.specs
        ):
            return None
        return self._inner.recv_queued()

    def recv_burst(self, timeout_s: float | None, limit: int) -> list[Envelope]:
        """Through this wrapper's :meth:`recv` and :meth:`recv_queued` (the default's
        loop), so that a paced link hands over one message at a time."""
        return Transport.recv_burst(self, timeout_s, limit)

    def _received(self, env: Envelope | None) -> None:
        schedule, node = self._active(), self._node
        if schedule is None or node is None or env is None or env.peer == self._coord:
            return
        nbytes = sum(len(f) for f in env.frames) + _shared_bytes(env.frames, self._job)
        started = time.perf_counter()
        schedule.on_bytes(nbytes, self._step)
        node.stalled(time.perf_counter() - started)  # before the node's handler times it

    def through_lane(self, peer: Peer) -> bool:
        return self._inner.through_lane(peer)

    def lost(self) -> list[Peer]:
        return self._inner.lost()

    def wake(self) -> None:
        self._inner.wake()

    def companion(self) -> Transport:
        return self._inner.companion()

    def close(self) -> None:
        """Stop competing processes, close the inner transport."""
        self._schedule.close()
        self._inner.close()


def _header(frames: Sequence[Frame], job: str) -> Header | None:
    try:
        return decode(frames[0], job) if frames else None
    except ProtocolError:
        return None  # refused by the node anyway: its frames are all it moved


def _shared_bytes(frames: Sequence[Frame], job: str) -> int:
    """The gradient bytes a PUSH left in shared memory (its ``sm``), or 0. A push that
    names a slot has no tensor frame, so only one-frame messages are read; one that
    does not read (:func:`~trimtab.protocol.headers.read_push`) is refused before its
    slot is, so it moved nothing there."""
    if len(frames) != 1:
        return 0
    header = _header(frames, job)
    if header is None or header["o"] != Data.PUSH or header.get("sm") is None:
        return 0
    try:
        push = headers.read_push(header)
    except ProtocolError:
        return 0
    return _numel_bytes(push.get("n"), push.get("dt"))


def _value_bytes(frames: Sequence[Frame], job: str) -> int:
    """The bytes of the value a VALUE carries (inline, as a frame or in shared memory),
    or 0 for any other message (the server builds every VALUE: each reads)."""
    header = _header(frames, job)
    if header is None or header["o"] != Data.VALUE:
        return 0
    try:
        value = headers.read_value(header)
    except ProtocolError:
        return 0
    return 0 if value.get("z") else _numel_bytes(value["n"], value.get("dt"))


def _numel_bytes(numel: int | None, dtype: str | None) -> int:
    if numel is None or dtype is None:
        return 0
    return numel * DTYPE_SIZES.get(dtype, 0)
