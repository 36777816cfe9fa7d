"""Which host a process is on, for the paths that only work within one host.

Shared memory and the local lane are for processes of one host. "One host" is not "one
machine": network namespaces make several hosts of one machine (the test bed,
containers), and ``/dev/shm`` may be shared among them while their networks are not. A
process's **host id** is its machine's boot id together with its network namespace
(the inode of ``/proc/self/ns/net``): two processes share it exactly when they share a
kernel and a network stack. A worker names its shared-memory arena after its host id,
and a server maps only arenas of its own host (:mod:`trimtab.roles.server.slots`); the
local lane's abstract Unix sockets exist per network namespace, so the lane cannot
cross hosts either.

Nothing here blocks or raises.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import socket

__all__ = ["host_id", "is_own_address", "process_running"]


@functools.cache
def host_id() -> str:
    """This process's host: 12 hex digits of its boot id and network namespace. A
    platform without either gives one id for the machine."""
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        parts.append(socket.gethostname())
    try:
        ns = os.stat("/proc/self/ns/net")
        parts.append(f"{ns.st_dev}:{ns.st_ino}")
    except OSError:
        pass
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:12]


@functools.cache
def is_own_address(host: str) -> bool:
    """Whether ``host`` (an IP address) belongs to this process's network stack: its
    loopback or an address of one of its interfaces (a socket can bind it). A name
    that is not an IP address is not looked up: False."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's counts): how a file
    or an arena named after its maker's pid tells a live maker from one that is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
