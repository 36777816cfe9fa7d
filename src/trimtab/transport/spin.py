"""Whether a wait polls before it sleeps: only while polling catches messages.

Polling for the next message (``TRIMTAB_SPIN_US``) saves waking a sleeping process, but
only when the message comes within the spin and the core spun on is not one that the
process which must send it needs. ``trimtab run`` turns polling on only where the job's
processes are no more than the cores, yet it cannot see the machine's other users: with
one other busy process on 2 cores, 200 us of polling halved the 1 KiB round trips of
``trimtab bench datapath`` (about 2,000 a second against 4,700 without), since the peer
that had to answer waited for the core the poller held. So a transport spins only while
most of its recent spins caught their message; otherwise it tries one wait in
:attr:`SpinPolicy.PROBE_EVERY` to see whether spinning pays again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import zmq
from zmq.backend import zmq_poll as _zmq_poll

from trimtab.errors import ConfigError

#: Microseconds a waiting worker or server polls for its next message before it sleeps.
SPIN_ENV = "TRIMTAB_SPIN_US"
#: What ``trimtab run`` sets (unless set already) when the job's workers and servers on
#: this machine are no more than its cores. A sleeping process woken by a message answers
#: it tens to a hundred us later; a 1 KiB round trip here waits about 100 us on each
#: side, so 50 us of polling gained 10%, 100 us doubled the round trips per second and
#: more gained nothing more (BENCHMARKS.md): twice the knee, for slower machines.
SPIN_DEFAULT_US = 200
#: The longest spin accepted: beyond a few ms, sleeping costs nothing measurable.
_SPIN_MAX_US = 10_000


def check_spin(spin_s: float) -> None:
    """Raise :class:`ConfigError` unless ``spin_s`` is from 0 to 0.01 s. Never blocks."""
    if not 0 <= spin_s <= _SPIN_MAX_US / 1e6:
        raise ConfigError(
            f"spin_s={spin_s!r}: a waiting node polls from 0 to {_SPIN_MAX_US / 1e6} s "
            f"before it sleeps ({SPIN_ENV} gives it in microseconds)"
        )


def spin_from_env(environ: Mapping[str, str]) -> float:
    """Seconds from ``TRIMTAB_SPIN_US`` in ``environ`` (unset: 0, no spinning), for the
    edges that read the environment (the CLI, ``trimtab.init()``) to pass on. Never
    blocks. Raises :class:`ConfigError` unless it is microseconds from 0 to 10000.
    """
    return parse_spin(environ.get(SPIN_ENV, ""))


def parse_spin(raw: str) -> float:
    """Seconds from a ``TRIMTAB_SPIN_US`` value (empty: 0). Raises as :func:`spin_from_env`."""
    raw = raw.strip()
    if not raw:
        return 0.0
    try:
        us = float(raw)
    except ValueError:
        us = -1.0
    if not 0 <= us <= _SPIN_MAX_US:
        raise ConfigError(
            f"{SPIN_ENV}={raw!r}: give the microseconds a waiting node polls before it "
            f"sleeps, from 0 (never) to {_SPIN_MAX_US}; e.g. {SPIN_ENV}={SPIN_DEFAULT_US}"
        )
    return us / 1e6


class SpinPolicy:
    """The record of one transport's spins, and whether its next wait should spin.

    Not thread-safe: its transport's owning thread uses it. Never blocks.
    """

    #: Waits over which the share of spins that caught their message is averaged.
    WINDOW = 16
    #: Spinning goes on while at least this share of recent spins caught a message.
    KEEP = 0.5
    #: While spinning does not pay, one wait in this many spins, to see if it pays again.
    PROBE_EVERY = 32

    def __init__(self) -> None:
        #: Recent spins that caught a message (an exponential average; 1 at first).
        self.hit_rate = 1.0
        self.hits = 0
        self.misses = 0
        self._waits_off = 0

    def should_spin(self) -> bool:
        """Whether the wait about to start should poll before it sleeps."""
        if self.hit_rate >= self.KEEP:
            return True
        self._waits_off += 1
        if self._waits_off >= self.PROBE_EVERY:
            self._waits_off = 0
            return True
        return False

    def spun(self, caught: bool) -> None:
        """Record a spin: whether a message arrived before it ran out."""
        if caught:
            self.hits += 1
        else:
            self.misses += 1
        self.hit_rate += (float(caught) - self.hit_rate) / self.WINDOW


def poll_spinning(
    poller: zmq.Poller, timeout_ms: int | None, spin_s: float, spins: SpinPolicy
) -> dict[Any, int]:
    """``dict(poller.poll(timeout_ms))`` (forever for None); with ``spin_s`` > 0, and
    while ``spins`` says spinning pays, polls without sleeping for ``spin_s`` first: a
    message that arrives meanwhile is read at once, not after the scheduler wakes this
    thread (tens of us here, and caches gone cold). pyzmq's compiled poll is called
    with the poller's sockets itself, without the method that wraps it (a Python call
    a message). Blocks."""
    sockets = poller.sockets
    if spin_s > 0 and timeout_ms != 0 and spins.should_spin():
        until = time.perf_counter() + spin_s
        while True:
            events = _zmq_poll(sockets, 0)
            if events:
                spins.spun(True)
                return dict(events)
            if time.perf_counter() >= until:
                break
        spins.spun(False)
    return dict(_zmq_poll(sockets, -1 if timeout_ms is None else timeout_ms))
