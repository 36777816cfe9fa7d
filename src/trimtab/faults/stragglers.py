"""Straggler injection, for experiments and tests.

One syntax for every kind, given to ``trimtab run``, ``trimtab train`` and the
experiments as ``--straggler SPEC`` (repeatable, or several SPECs joined by ``;``)::

    ROLE:INDEX:KIND=VALUE[@START-[END]]

    worker:2:slowdown=3@0-      worker 2 computes 3x slower from step 0 on (static)
    worker:1:slowdown=4@20-60   worker 1 is 4x slower from step 20 to step 59 (transient)
    worker:3:drift=0.3          worker 3's slowdown is a random walk (log-steps of sd 0.3,
                                between 1x and 8x), seeded by its rank
    worker:0:cpu=1@10-          a busy process competes with worker 0 for its core
    server:1:bandwidth=25MB/s@20-80
                                server 1 moves at most 25 MB/s (a token bucket over what
                                it receives and sends) from step 20 to step 79
    server:0:delay=4ms/MB       server 0 spends 4 ms more per MB it handles
    server:2:cpu=1              a busy process competes with server 2 for its core

A slowdown of K is real compute plus a sleep of (K - 1) x the compute time of the step:
the work stays real, its speed is what is emulated. A server's step is the highest
clock it has completed on any chunk it owns. A worker's schedule runs through the step
hook :class:`trimtab.faults.slowdown.WorkerSlowdown`, a server's through the transport
:class:`trimtab.faults.throttle.ThrottledTransport`, both wired in around the roles.
Units: bandwidth in B/s, KB/s, MB/s, GB/s (powers of 1000) or KiB/s, MiB/s, GiB/s; delay
in s/MB, ms/MB or us/MB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import os
import random
import time
from collections.abc import Iterable, Sequence
from multiprocessing.process import BaseProcess

from trimtab.errors import ConfigError

WORKER_KINDS = ("slowdown", "drift", "cpu")
SERVER_KINDS = ("bandwidth", "delay", "cpu")
#: The environment variable that carries the specs from the launcher to the workers.
ENV = "TRIMTAB_STRAGGLERS"


@dataclasses.dataclass(frozen=True)
class StragglerSpec:
    """One straggler: which node, what kind, how strong, and when (steps ``[start, end)``)."""

    role: str
    index: int
    kind: str
    value: float
    start: int = 0
    end: int | None = None

    def active(self, step: int) -> bool:
        return step >= self.start and (self.end is None or step < self.end)

    def __str__(self) -> str:
        end = "" if self.end is None else str(self.end)
        return f"{self.role}:{self.index}:{self.kind}={self.value:g}@{self.start}-{end}"


def parse_stragglers(texts: str | Iterable[str]) -> list[StragglerSpec]:
    """Parse ``--straggler`` values. Raises :class:`ConfigError` saying what is wrong."""
    items = [texts] if isinstance(texts, str) else list(texts)
    specs = []
    for text in (part.strip() for item in items for part in item.split(";")):
        if text:
            specs.append(_parse_one(text))
    return specs


def _parse_one(text: str) -> StragglerSpec:
    usage = (
        f"straggler {text!r}: expected ROLE:INDEX:KIND=VALUE[@START-[END]], e.g. "
        "worker:2:slowdown=3@0-"
    )
    body, _, when = text.partition("@")
    parts = body.split(":")
    if len(parts) != 3 or "=" not in parts[2]:
        raise ConfigError(usage)
    role, index_text, setting = parts
    kind, _, value_text = setting.partition("=")
    if role not in ("worker", "server"):
        raise ConfigError(f"{usage}; ROLE is worker or server")
    kinds = WORKER_KINDS if role == "worker" else SERVER_KINDS
    if kind not in kinds:
        raise ConfigError(f"{usage}; {role} kinds are {kinds}")
    try:
        index = int(index_text)
        value = _value(kind, value_text)
        start, end = 0, None
        if when:
            first, dash, last = when.partition("-")
            if not dash:
                raise ValueError(when)
            start = int(first)
            end = int(last) if last else None
    except ValueError as exc:
        raise ConfigError(f"{usage} ({exc})") from None
    if index < 0 or start < 0 or (end is not None and end <= start):
        raise ConfigError(f"{usage}; index and steps must be >= 0 and END > START")
    if kind == "slowdown" and value < 1:
        raise ConfigError(f"straggler {text!r}: a slowdown is >= 1 (3 = three times slower)")
    if kind in ("drift", "cpu", "bandwidth", "delay") and value <= 0:
        raise ConfigError(f"straggler {text!r}: {kind} must be positive")
    return StragglerSpec(role, index, kind, value, start, end)


_RATE_UNITS = {
    "b/s": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "kib/s": 1024.0,
    "mib/s": 1024.0**2,
    "gib/s": 1024.0**3,
}
_DELAY_UNITS = {"s/mb": 1e-6, "ms/mb": 1e-9, "us/mb": 1e-12}


def _value(kind: str, text: str) -> float:
    """A spec's value in base units: bytes/s for bandwidth, seconds/byte for delay.
    Raises ValueError on a malformed number or an unknown unit."""
    units = _RATE_UNITS if kind == "bandwidth" else _DELAY_UNITS if kind == "delay" else None
    if units is None:
        return float(text)
    lowered = text.strip().lower()
    for unit in sorted(units, key=len, reverse=True):
        if lowered.endswith(unit):
            return float(lowered[: -len(unit)]) * units[unit]
    raise ValueError(f"{text!r} needs a unit: one of {sorted(units)}")


def _burn() -> None:  # pragma: no cover - runs in the competing process
    while True:
        pass


class WorkerStraggler:
    """The slowdown schedule of one worker. Not thread-safe; the training thread uses it.

    :meth:`factor` says how much slower step ``clock`` must be; :meth:`on_step` starts
    and stops competing processes as the schedule says. :meth:`close` stops them.
    """

    MAX_DRIFT = 8.0

    def __init__(self, specs: Sequence[StragglerSpec], rank: int) -> None:
        self.specs = [s for s in specs if s.role == "worker" and s.index == rank]
        self.rank = rank
        self._rng = random.Random(1000 + rank)
        self._drift_log = 0.0
        self._drift_clock = -1
        self._burners: list[BaseProcess] = []
        self._affinity: set[int] | None = None

    def __bool__(self) -> bool:
        return bool(self.specs)

    def factor(self, clock: int) -> float:
        """The slowdown for step ``clock`` (1.0 = none)."""
        f = 1.0
        for s in self.specs:
            if not s.active(clock):
                continue
            if s.kind == "slowdown":
                f *= s.value
            elif s.kind == "drift":
                while self._drift_clock < clock:
                    self._drift_clock += 1
                    step = self._rng.gauss(0.0, s.value)
                    self._drift_log = min(
                        max(self._drift_log + step, 0.0), math.log(self.MAX_DRIFT)
                    )
                f *= math.exp(self._drift_log)
        return f

    def on_step(self, clock: int) -> None:
        """Start or stop competing CPU processes for step ``clock``."""
        wanted = sum(int(s.value) for s in self.specs if s.kind == "cpu" and s.active(clock))
        if wanted and not self._burners:
            # Share one core with the competitors, so the interference lands on us.
            self._affinity = os.sched_getaffinity(0)
            core = sorted(self._affinity)[self.rank % len(self._affinity)]
            os.sched_setaffinity(0, {core})
            ctx = multiprocessing.get_context("fork")
            for _ in range(wanted):
                p = ctx.Process(target=_burn, daemon=True)
                p.start()
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(p.pid or 0, {core})
                self._burners.append(p)
        elif not wanted and self._burners:
            self.close()

    def close(self) -> None:
        """Stop competing processes and give this process its cores back."""
        for p in self._burners:
            p.kill()
            p.join(timeout=5)
        self._burners = []
        if self._affinity is not None:
            os.sched_setaffinity(0, self._affinity)
            self._affinity = None


class ServerStraggler:
    """The slowdown schedule of one server. Not thread-safe; the server's loop uses it,
    through the transport that paces it (:class:`trimtab.faults.throttle.ThrottledTransport`).

    :meth:`on_bytes` blocks for as long as the schedule says handling ``nbytes`` at
    step ``step`` takes beyond the real work: a token bucket for ``bandwidth`` (bursts
    of up to 20 ms of traffic pass at once) plus ``delay`` seconds per byte.
    :meth:`on_step` starts and stops competing processes; :meth:`close` stops them.
    """

    BURST_S = 0.02

    def __init__(self, specs: Sequence[StragglerSpec], index: int) -> None:
        self.specs = [s for s in specs if s.role == "server" and s.index == index]
        self._free_at = 0.0
        self._cpu = WorkerStraggler(
            [dataclasses.replace(s, role="worker") for s in self.specs if s.kind == "cpu"],
            index,
        )

    def __bool__(self) -> bool:
        return bool(self.specs)

    def on_bytes(self, nbytes: int, step: int) -> None:
        """Sleep as long as a slower server would take for ``nbytes`` more. Blocks."""
        rate = min(
            (s.value for s in self.specs if s.kind == "bandwidth" and s.active(step)),
            default=None,
        )
        delay = sum(s.value for s in self.specs if s.kind == "delay" and s.active(step))
        now = time.monotonic()
        pause = nbytes * delay
        if rate is not None:
            self._free_at = max(now, self._free_at) + nbytes / rate
            pause += max(0.0, self._free_at - now - self.BURST_S)
        if pause > 0:
            time.sleep(pause)

    def on_step(self, step: int) -> None:
        """Start or stop competing CPU processes for ``step``."""
        self._cpu.on_step(step)

    def close(self) -> None:
        """Stop competing processes."""
        self._cpu.close()
