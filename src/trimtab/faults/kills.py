"""Crash injection, for tests and experiments: the ``--fault`` specs.

One syntax, given to ``trimtab run`` as ``--fault SPEC`` (repeatable, or several SPECs
joined by ``;``)::

    ROLE:INDEX:kill@STEP[:PHASE]      kill a process with SIGKILL at a step
    worker:+COUNT@STEP                start COUNT more workers at a step (a join)

    server:1:kill@30                  server 1 dies as it applies step 30's update to
                                      its first chunk (before that value leaves it)
    server:1:kill@30:migrating        server 1 dies as the first migration after it
                                      applied step 30 reaches it (before it takes it)
    coordinator:0:kill@30             the coordinator dies as a worker reports step 30
                                      (1: its first replacement, and so on)
    worker:2:kill@60                  worker 2 dies before it pushes step 60's gradient
    worker:2:kill@60:mid-push         ... after half of step 60's pushes left it
    worker:2:kill@60:after-reply      ... once the last reply of step 60 reached it
    worker:+1@90                      the launcher starts one more worker once a worker
                                      reached step 90

A step is a worker's clock (0 for the first). A worker's phases (``before-push`` by
default):

- ``before-push``: it has finished step STEP - 1 and computed step STEP's gradient;
  nothing of step STEP has left it.
- ``mid-push``: half of step STEP's chunks (rounded up; as many as it pushed at the step
  before, one at step 0) were pushed; it dies right after the last of those left.
- ``after-reply``: every chunk it pushed at step STEP was answered; it dies before it
  uses the answers or sends anything more.

A server has two points: the first value of step STEP it is about to send (step STEP
applied to one chunk; no value of that step has left it yet), and (``migrating``) the
first MIGRATE it receives once it sent a value of step STEP or later, before it takes
it: the other servers take that map, and the job must find each chunk's newest copy.
A coordinator has one point: the first step report (REPORT) of step STEP or later it
receives. INDEX is the index the job gave the server (``trimtab.job_status()``), a
worker's rank, and a coordinator's number: 0 the first, 1 the first that replaced a dead
one (the launcher passes each only the kills of its number).

The victim kills itself (:mod:`trimtab.faults.crash`), so the point is exact, and
prints a :data:`MARKER` line first that says what and when, which the launcher and the
experiments read. Joins are the launcher's (:mod:`trimtab.launch.faults`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable
from typing import Any

from trimtab.errors import ConfigError

#: The environment variable that carries the specs from the launcher to the roles.
ENV = "TRIMTAB_FAULTS"
#: The line a victim prints just before it dies: this, then JSON (see :func:`marker`).
MARKER = "TRIMTAB_FAULT "


class Phase(enum.Enum):
    """Where in its step a worker dies (a server has one point: :attr:`APPLIED`)."""

    BEFORE_PUSH = "before-push"
    MID_PUSH = "mid-push"
    AFTER_REPLY = "after-reply"
    APPLIED = "applied"
    MIGRATING = "migrating"


WORKER_PHASES = (Phase.BEFORE_PUSH, Phase.MID_PUSH, Phase.AFTER_REPLY)


class Action(enum.Enum):
    KILL = "kill"
    JOIN = "join"


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    """One fault: ``role``'s process ``index`` killed at ``step``/``phase``, or ``count``
    workers joining at ``step`` (``index`` is -1 for a join)."""

    role: str
    action: Action
    step: int
    index: int = -1
    phase: Phase = Phase.BEFORE_PUSH
    count: int = 0

    def names(self, role: str, index: int) -> bool:
        """Whether this is a kill of ``role``'s process ``index``."""
        return self.action is Action.KILL and self.role == role and self.index == index

    def __str__(self) -> str:
        if self.action is Action.JOIN:
            return f"{self.role}:+{self.count}@{self.step}"
        phase = "" if self.phase in (Phase.BEFORE_PUSH, Phase.APPLIED) else f":{self.phase.value}"
        return f"{self.role}:{self.index}:kill@{self.step}{phase}"


def parse_faults(texts: str | Iterable[str]) -> list[FaultSpec]:
    """Parse ``--fault`` values (each may hold several specs joined by ``;``). Raises
    :class:`ConfigError` naming the bad spec and the bad part of it. Never blocks."""
    items = [texts] if isinstance(texts, str) else list(texts)
    return [
        _parse_one(text)
        for text in (part.strip() for item in items for part in item.split(";"))
        if text
    ]


_USAGE = "expected ROLE:INDEX:kill@STEP[:PHASE] or worker:+COUNT@STEP, e.g. server:1:kill@30"


def _parse_one(text: str) -> FaultSpec:
    def bad(part: str, why: str) -> ConfigError:
        return ConfigError(f"fault {text!r}: {part} {why} ({_USAGE})")

    body, at, when = text.partition("@")
    if not at:
        raise bad("'@STEP'", "is missing")
    parts = body.split(":")
    role = parts[0]
    if role not in ("worker", "server", "coordinator"):
        raise bad(f"role {role!r}", "is not worker, server or coordinator")
    step_text, _, phase_text = when.partition(":")
    step = _number(step_text, "step", bad)
    if len(parts) == 2 and parts[1].startswith("+"):
        if role != "worker":
            raise bad(f"{parts[1]!r}", "is a join, and only workers join this way")
        if phase_text:
            raise bad(f"phase {phase_text!r}", "is for kills; a join happens between steps")
        count = _number(parts[1][1:], "count", bad)
        if count < 1:
            raise bad(f"count {count}", "must be at least 1")
        return FaultSpec(role, Action.JOIN, step, count=count)
    if len(parts) != 3:
        raise bad(f"{body!r}", "needs three parts, ROLE:INDEX:kill")
    index = _number(parts[1], "index", bad)
    if parts[2] != Action.KILL.value:
        raise bad(f"action {parts[2]!r}", "is not kill")
    if role == "coordinator":
        if phase_text:
            raise bad(f"phase {phase_text!r}", "is for workers and servers")
        return FaultSpec(role, Action.KILL, step, index, Phase.APPLIED)
    if role == "server":
        if phase_text and phase_text != Phase.MIGRATING.value:
            raise bad(
                f"phase {phase_text!r}",
                "is for workers; a server dies as it applies the step to its first chunk, "
                "or (migrating) as a migration after that step reaches it",
            )
        phase = Phase.MIGRATING if phase_text else Phase.APPLIED
        return FaultSpec(role, Action.KILL, step, index, phase)
    phases = {p.value: p for p in WORKER_PHASES}
    if phase_text and phase_text not in phases:
        raise bad(f"phase {phase_text!r}", f"is not one of {', '.join(phases)}")
    return FaultSpec(role, Action.KILL, step, index, phases.get(phase_text, Phase.BEFORE_PUSH))


def _number(text: str, what: str, bad: Any) -> int:
    try:
        value = int(text)
    except ValueError:
        raise bad(f"{what} {text!r}", "is not a whole number") from None
    if value < 0:
        raise bad(f"{what} {value}", "must be >= 0")
    return value


def marker(spec: FaultSpec, at: float, **facts: Any) -> str:
    """The line a victim prints before it dies: :data:`MARKER`, then a JSON object with
    the spec (``spec``), ``role``, ``index``, ``step``, ``phase``, the wall-clock time
    ``at`` (``time.time()``) and ``facts``. Never blocks."""
    body = {
        "spec": str(spec),
        "role": spec.role,
        "index": spec.index,
        "step": spec.step,
        "phase": spec.phase.value,
        "at": at,
        **facts,
    }
    return MARKER + json.dumps(body, sort_keys=True)


def read_marker(line: str) -> dict[str, Any] | None:
    """The JSON of a :func:`marker` line found in ``line`` (a launcher may have
    prefixed it), or None. Never raises."""
    _, found, rest = line.partition(MARKER)
    if not found:
        return None
    try:
        body = json.loads(rest)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None
