"""A process that kills itself where a ``--fault`` spec says (:mod:`trimtab.faults.kills`),
emulated around the role, as a slow server is (:mod:`trimtab.faults.throttle`): a
:class:`CrashingTransport` reads the headers its node sends and receives, and at the
spec's step and phase prints the spec's marker line and sends itself SIGKILL, so the
role knows nothing of fault injection and dies as a crashed process does (no exit
handler, no goodbye to its peers)::

    transport = CrashingTransport(inner, WorkerCrash(specs), job)     # a worker
    transport = CrashingTransport(inner, ServerCrash(specs), job)     # a server
    ...
    crash.follow(server)   # a server's index is known once it registered

A worker learns its rank from its own pushes (``r``); a server's index comes from the
node it follows. Only a process some spec names pays for reading headers: the
``wrap_*`` helpers return the inner transport untouched otherwise.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from trimtab.errors import ProtocolError
from trimtab.faults.kills import Action, FaultSpec, Phase, marker
from trimtab.protocol.messages import Control, Data, Header, decode
from trimtab.transport import Envelope, Frame, Peer, Transport

_PUSH = int(Data.PUSH)
_VALUE = int(Data.VALUE)
_MIGRATE = int(Control.MIGRATE)
_REPORT = int(Control.REPORT)


def die(spec: FaultSpec, **facts: Any) -> None:  # pragma: no cover - the process ends here
    """Print ``spec``'s marker line and end this process with SIGKILL. Never returns."""
    sys.stdout.write(marker(spec, time.time(), pid=os.getpid(), **facts) + "\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is on its way; nothing more may happen meanwhile


class Crash(Protocol):
    """What a :class:`CrashingTransport` tells about the messages it moves. Each method
    may end the process (:func:`die`); none blocks otherwise."""

    def sending(self, header: Header) -> None: ...

    def sent(self, header: Header) -> None: ...

    def received(self, header: Header) -> None: ...


class WorkerCrash:
    """The kill points of the worker whose pushes it sees (rank ``r``). Thread-safe.

    ``before-push``: at the first push of the step, before it leaves. ``mid-push``:
    right after the push that makes half of the step's chunks (as many as the step
    before had, rounded up; 1 at step 0). ``after-reply``: when every chunk pushed at
    the step has been answered (a VALUE of the step's round or later), counting at
    least as many chunks as the step before had.
    """

    def __init__(self, specs: Sequence[FaultSpec]) -> None:
        self.specs = [s for s in specs if s.action is Action.KILL and s.role == "worker"]
        self._lock = threading.Lock()
        self._rank = -1
        self._pushed: dict[int, set[int]] = {}  # clock -> chunks pushed at it
        self._answered: dict[int, set[int]] = {}  # clock -> chunks answered past it

    def __bool__(self) -> bool:
        return bool(self.specs)

    def _due(self, clock: int, phase: Phase) -> FaultSpec | None:
        for s in self.specs:
            if s.index == self._rank and s.step == clock and s.phase is phase:
                return s
        return None

    def sending(self, header: Header) -> None:
        if header.get("o") != _PUSH or header.get("g"):
            return
        with self._lock:
            self._rank = int(header.get("r", -1))
            clock = int(header.get("k", -1))
            if not self._pushed.get(clock):
                spec = self._due(clock, Phase.BEFORE_PUSH)
                if spec is not None:
                    die(spec, chunks_pushed=0)

    def sent(self, header: Header) -> None:
        if header.get("o") != _PUSH or header.get("g"):
            return
        with self._lock:
            clock = int(header.get("k", -1))
            pushed = self._pushed.setdefault(clock, set())
            pushed.add(int(header.get("c", -1)))
            for old in [k for k in self._pushed if k < clock - 1]:
                del self._pushed[old]
            spec = self._due(clock, Phase.MID_PUSH)
            if spec is not None:
                before = len(self._pushed.get(clock - 1, ())) or 1
                if len(pushed) >= (before + 1) // 2:
                    die(spec, chunks_pushed=len(pushed), chunks_before=before)

    def received(self, header: Header) -> None:
        if header.get("o") != _VALUE:
            return
        with self._lock:
            for spec in self.specs:
                if spec.index != self._rank or spec.phase is not Phase.AFTER_REPLY:
                    continue
                clock = spec.step
                if int(header.get("k", -1)) < clock:  # k: the round the VALUE answers
                    continue
                answered = self._answered.setdefault(clock, set())
                answered.add(int(header.get("c", -1)))
                pushed = self._pushed.get(clock, set())
                wanted = max(len(pushed), len(self._pushed.get(clock - 1, ())), 1)
                if pushed and pushed <= answered and len(answered) >= wanted:
                    die(spec, chunks_answered=len(answered))


class Indexed(Protocol):
    """The node a :class:`ServerCrash` follows: its index in the job (-1 until known)."""

    @property
    def index(self) -> int: ...


class ServerCrash:
    """The kill points of the server it follows (:meth:`follow`): the first VALUE it is
    about to send of the spec's step's round or later (``k``: the round a VALUE
    answers, the clock of the pushes it aggregated) once that step is applied (its
    version ``v`` past the step); with ``migrating``, the first MIGRATE it receives
    once it sent such a VALUE. Thread-safe."""

    def __init__(self, specs: Sequence[FaultSpec]) -> None:
        self.specs = [s for s in specs if s.action is Action.KILL and s.role == "server"]
        self._node: Indexed | None = None
        self._reached = -1  # the latest round a VALUE it sent answered

    def __bool__(self) -> bool:
        return bool(self.specs)

    def follow(self, node: Indexed) -> None:
        """Watch for ``node``'s index from now on."""
        self._node = node

    def sending(self, header: Header) -> None:
        if header.get("o") != _VALUE or self._node is None:
            return
        index = self._node.index
        # The round it answers is the step, and the update is applied (a PULL's answer
        # between rounds carries the next round and the version before it).
        k, v = int(header.get("k", -1)), int(header.get("v", -1))
        self._reached = max(self._reached, k)
        for spec in self.specs:
            if spec.phase is not Phase.APPLIED:
                continue
            if spec.index == index and k >= spec.step and v > spec.step:
                die(spec, chunk=header.get("c"), version=header.get("v"))

    def sent(self, header: Header) -> None:
        pass

    def received(self, header: Header) -> None:
        if header.get("o") != _MIGRATE or self._node is None:
            return
        for spec in self.specs:
            if (
                spec.phase is Phase.MIGRATING
                and spec.index == self._node.index
                and self._reached >= spec.step
            ):
                die(spec, epoch=header.get("epoch"), round=self._reached)


class CoordinatorCrash:
    """The kill point of a coordinator: the first REPORT of the spec's step or later it
    receives (every coordinator kill spec it is given applies: the launcher gives each
    coordinator those of its number). Loop thread only."""

    def __init__(self, specs: Sequence[FaultSpec]) -> None:
        self.specs = [s for s in specs if s.action is Action.KILL and s.role == "coordinator"]

    def __bool__(self) -> bool:
        return bool(self.specs)

    def sending(self, header: Header) -> None:
        pass

    def sent(self, header: Header) -> None:
        pass

    def received(self, header: Header) -> None:
        if header.get("o") != _REPORT:
            return
        clock = header.get("k")
        for spec in self.specs:
            if type(clock) is int and clock >= spec.step:
                die(spec, clock=clock)


class CrashingTransport(Transport):
    """A :class:`Transport` that shows ``crash`` the header of every message it sends
    and receives (and so may end the process, see :func:`die`); otherwise ``inner``'s.
    Its companions share ``crash``. Threading and blocking as ``inner``."""

    def __init__(self, inner: Transport, crash: Crash, job: str) -> None:
        self._inner = inner
        self._crash = crash
        self._job = job

    @property
    def spin_s(self) -> float:
        return self._inner.spin_s

    @spin_s.setter
    def spin_s(self, value: float) -> None:
        self._inner.spin_s = value

    @property
    def address(self) -> str:
        return self._inner.address

    def connect(self, address: str) -> Peer:
        return self._inner.connect(address)

    def reconnect(self, address: str) -> Peer:
        return self._inner.reconnect(address)

    def send(self, peer: Peer, frames: Sequence[Frame]) -> None:
        header = _header(frames, self._job)
        if header is not None:
            self._crash.sending(header)
        self._inner.send(peer, frames)
        if header is not None:
            self._crash.sent(header)

    def recv(self, timeout_s: float | None) -> Envelope | None:
        return self._received(self._inner.recv(timeout_s))

    def recv_queued(self) -> Envelope | None:
        return self._received(self._inner.recv_queued())

    def recv_burst(self, timeout_s: float | None, limit: int) -> list[Envelope]:
        burst = self._inner.recv_burst(timeout_s, limit)
        for env in burst:  # each seen, in order, as recv() would have
            self._received(env)
        return burst

    def _received(self, env: Envelope | None) -> Envelope | None:
        if env is not None:
            header = _header(env.frames, self._job)
            if header is not None:
                self._crash.received(header)
        return env

    def through_lane(self, peer: Peer) -> bool:
        return self._inner.through_lane(peer)

    def send_to(self, address: str, frames: Sequence[Frame]) -> None:
        self.send(self.connect(address), frames)  # (each header shown to the crash)

    def lost(self) -> list[Peer]:
        return self._inner.lost()

    def wake(self) -> None:
        self._inner.wake()

    def companion(self) -> Transport:
        return CrashingTransport(self._inner.companion(), self._crash, self._job)

    def close(self) -> None:
        self._inner.close()


def _header(frames: Sequence[Frame], job: str) -> Header | None:
    try:
        return decode(frames[0], job) if frames else None
    except ProtocolError:
        return None  # the node refuses it anyway; no kill point is a malformed message


def wrap_worker(inner: Transport, specs: Sequence[FaultSpec], job: str) -> Transport:
    """``inner``, crashing where ``specs`` kill a worker (it learns its rank from its
    pushes); ``inner`` itself when no spec kills a worker. Never blocks."""
    crash = WorkerCrash(specs)
    return CrashingTransport(inner, crash, job) if crash else inner


def wrap_server(
    inner: Transport, specs: Sequence[FaultSpec], job: str
) -> tuple[Transport, ServerCrash | None]:
    """``inner`` crashing where ``specs`` kill a server, and the :class:`ServerCrash` to
    :meth:`~ServerCrash.follow` the server with; ``(inner, None)`` when no spec kills a
    server. Never blocks."""
    crash = ServerCrash(specs)
    if not crash:
        return inner, None
    return CrashingTransport(inner, crash, job), crash


def wrap_coordinator(inner: Transport, specs: Sequence[FaultSpec], job: str) -> Transport:
    """``inner`` watched for the coordinator kills among ``specs`` (all of which apply),
    or ``inner`` itself if there are none."""
    crash = CoordinatorCrash(specs)
    return CrashingTransport(inner, crash, job) if crash else inner
