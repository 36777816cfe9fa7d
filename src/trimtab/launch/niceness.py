"""A role started at the lowest CPU priority until it serves: the test bed's late servers.

The hosts of a test bed (:mod:`trimtab.launch.testbed`) are network namespaces of one
machine: they share its cores, where a cluster's machines each have their own. A server
the job asks for while it runs (PSLD's scale-out, ``trimtab scale``) spends its first
seconds importing torch, warming up and registering: on the 2-core machine of issue 38,
0.4 to 0.6 of a core for about 2.5 s, taken from the job's servers and workers in the
steps before it joins, which a joiner on a machine of its own does not take. So the
bed's backend starts such a server at the lowest priority (:func:`lower`, in the child
before exec) and tells it, by :data:`ENV`, the priority to take back once it serves
(:func:`restore`, called by ``trimtab server`` once the coordinator registered it):
from then on it competes for the cores as the job's other roles do.

A priority is two things on Linux: each thread's nice value, and, where the kernel groups
the threads of a session (``kernel.sched_autogroup_enabled``, on by default; every role
starts a session of its own), the session's group's nice value, which weighs the group
against the machine's other sessions. Both are lowered and both are restored: the
threads' to the launcher's own nice value, the group's to 0 (a new session's).

Raising a priority back needs ``CAP_SYS_NICE`` (root) or an ``RLIMIT_NICE`` that allows
it. Where this process has neither, :func:`why_not` says so and the bed starts late
servers at normal priority (its ``where`` line says which): a role is never lowered by
a launcher that could not raise it back.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import time
from collections.abc import Mapping
from pathlib import Path

from trimtab.errors import ConfigError

__all__ = ["ENV", "START_NICE", "lower", "nices", "restore", "serving_nice", "why_not"]

#: The nice value a late server starts at (the lowest priority).
START_NICE = 19
#: The nice value a server takes once it serves (set by the bed's backend for a server
#: it started at :data:`START_NICE`; read by ``trimtab server``).
ENV = "TRIMTAB_SERVING_NICE"

_CAP_SYS_NICE = 23
_AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")
_GROUP = re.compile(r"nice\s+(-?\d+)")


def _capable() -> bool:
    """Whether this process has ``CAP_SYS_NICE`` in its effective set."""
    try:
        status = Path("/proc/self/status").read_text()
        found = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)
    except OSError:
        return False
    return found is not None and bool(int(found.group(1), 16) >> _CAP_SYS_NICE & 1)


def why_not(to: int) -> str | None:
    """Why this process could not raise a process it starts at :data:`START_NICE` back
    to nice ``to`` (a sentence), or None if it could: ``CAP_SYS_NICE``, or a soft
    ``RLIMIT_NICE`` of ``20 - to`` or more (what a child inherits). Never blocks or
    raises."""
    if not hasattr(os, "setpriority") or not Path("/proc/self/task").is_dir():
        return "thread priorities are Linux's"
    if _capable():
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or 20 - soft <= to:
        return None
    return (
        f"raising a priority back to nice {to} needs root (CAP_SYS_NICE) or "
        f"RLIMIT_NICE {20 - to} (here {soft})"
    )


def _grouped() -> bool:
    """Whether the kernel groups a session's threads for scheduling (autogroup)."""
    try:
        return _AUTOGROUP.read_text().strip() == "1" and Path("/proc/self/autogroup").exists()
    except OSError:
        return False


def lower() -> None:  # pragma: no cover - runs in the child before exec (tested by the bed's)
    """In a child before exec, after it started its own session: its thread and its
    session's group to nice :data:`START_NICE` (what it execs and every thread it makes
    inherit both). Raises OSError if the kernel refuses (lowering is always allowed)."""
    os.setpriority(os.PRIO_PROCESS, 0, START_NICE)
    if _grouped():
        Path("/proc/self/autogroup").write_text(str(START_NICE))


def nices(pid: int | None = None) -> tuple[list[int], int | None]:
    """Process ``pid``'s (default: this one's) threads' nice values, and its session's
    group's (None where the kernel does not group). Threads that end meanwhile are left
    out. Never blocks; raises OSError if the process is gone."""
    base = Path(f"/proc/{pid or 'self'}")
    values = []
    for task in sorted((base / "task").iterdir()):
        try:
            values.append(os.getpriority(os.PRIO_PROCESS, int(task.name)))
        except OSError:
            continue  # (ended)
    group = None
    if _grouped():
        found = _GROUP.search((base / "autogroup").read_text())
        group = int(found.group(1)) if found else None
    return values, group


def restore(to: int) -> int:
    """Every thread of this process to nice ``to`` and its session's group to 0, as the
    job's other roles have them; returns how many threads were set. Threads made
    meanwhile are taken in further passes. Raises OSError where this process may not
    (PermissionError: see :func:`why_not`): then nothing was changed (this thread goes
    first, then the group, put back if the group refuses; every thread has the same
    rights). Blocks 0.1 s at most twice, where the kernel rate-limits a group's change
    (without ``CAP_SYS_ADMIN``)."""
    me = threading_id()
    os.setpriority(os.PRIO_PROCESS, me, to)  # the refusal, if any, before anything changed
    try:
        _restore_group()
    except OSError:
        os.setpriority(os.PRIO_PROCESS, me, START_NICE)  # (lowering is always allowed)
        raise
    done = {me}
    for _ in range(5):  # a thread made during a pass inherits its maker's value
        left = [int(t.name) for t in Path("/proc/self/task").iterdir() if int(t.name) not in done]
        if not left:
            break
        for tid in left:
            with contextlib.suppress(ProcessLookupError):  # (ended)
                os.setpriority(os.PRIO_PROCESS, tid, to)
            done.add(tid)
    return len(done)


def _restore_group() -> None:
    """This session's group to nice 0, where the kernel groups sessions. Raises OSError
    if it refuses 3 times, 0.11 s apart (its rate limit without ``CAP_SYS_ADMIN``)."""
    if not _grouped():
        return
    for attempt in range(3):
        try:
            Path("/proc/self/autogroup").write_text("0")
            return
        except BlockingIOError:
            if attempt == 2:
                raise
            time.sleep(0.11)


def threading_id() -> int:
    """This thread's kernel id. Never blocks."""
    return int(getattr(os, "gettid", os.getpid)())


def serving_nice(environ: Mapping[str, str]) -> int | None:
    """:data:`ENV` from ``environ``: the nice value to take once serving, or None where
    unset. Raises :class:`ConfigError` for one that is not a whole number in -20..19."""
    raw = environ.get(ENV)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 99
    if not -20 <= value <= 19:
        raise ConfigError(f"{ENV}={raw!r} must be a nice value, a whole number in -20..19")
    return value
