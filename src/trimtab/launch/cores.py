"""How many cores this process may use (affinity, bounded by a container's CPU quota),
and how busy the machine's cores are."""

from __future__ import annotations

import math
import os
from pathlib import Path


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its affinity where the OS says, bounded by a
    cgroup CPU quota (a container's CPU limit, which affinity does not show), rounded
    up. Never blocks or raises."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cgroup_cpu_quota(root: Path) -> float | None:
    """The CPUs a cgroup quota under ``root`` allows (v2 ``cpu.max``, else v1's CFS
    quota over its period), or ``None`` where there is none. Never blocks or raises."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def machine_cpu(stat: Path = Path("/proc/stat")) -> tuple[float, float] | None:
    """Seconds of CPU the whole machine spent busy and idle since boot, all cores together
    (``/proc/stat``; steal counts as busy: the cores were not ours), or ``None`` where
    that cannot be read (not Linux). Two readings apart give the cores busy between
    them (:func:`cores_busy`): every process's, and in a container its host's. Never
    blocks or raises."""
    try:
        fields = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) * tick_s, idle * tick_s


def cores_busy(
    before: tuple[float, float] | None, after: tuple[float, float] | None, wall_s: float
) -> float | None:
    """The machine's cores busy on average over ``wall_s`` seconds between two readings
    of :func:`machine_cpu` (2.0: two cores busy all along), or ``None`` without both
    readings. Pure."""
    if before is None or after is None or wall_s <= 0:
        return None
    return (after[0] - before[0]) / wall_s
