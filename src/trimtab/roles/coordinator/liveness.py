"""Which of a job's members are gone, and why. Pure: no sockets, no threads.

A member is lost when:

- its **connection closed** (its transport says so at once, :meth:`Transport.lost`): the
  kernel closes a process's sockets when it exits or is killed, SIGKILL included, so a
  dead member is known within a loop turn. A slow member (a straggler, a process
  starved of CPU or throttled) keeps its connection, so it is never declared dead this
  way. The member has :data:`CLOSED_GRACE_S` to have said DONE first: a message sent
  just before the close may still be queued behind it;
- it **said it failed** (DONE with a failure, the worker's uncaught exception);
- it has been **silent** for ``dead_after_s`` (the last resort, for a host that
  vanished without closing its connections, or a transport that cannot watch them).

Each loss goes to one place, :meth:`Coordinator.member_lost`, which decides what the
job does about it; :func:`lost_message` says it in words.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from trimtab.core.chunks import PlacementMap
from trimtab.roles.coordinator.members import Member, Members, Role
from trimtab.transport.base import Peer

#: Seconds a member whose connection closed has to have said DONE: then it is lost.
CLOSED_GRACE_S = 0.3

#: Why a member whose connection closed is lost.
CLOSED = "its connection closed (the process exited or was killed)"


class Liveness:
    """Watches a job's members for closed connections and silence. Not thread-safe:
    the coordinator's loop owns it.

    Args:
        dead_after_s: a member silent this long is lost.
        grace_s: how long after its connection closed a member that did not say DONE
            is lost.
    """

    def __init__(self, dead_after_s: float, grace_s: float = CLOSED_GRACE_S) -> None:
        self.dead_after_s = dead_after_s
        self.grace_s = grace_s
        self._closed: dict[Peer, float] = {}  # peer -> when its connection closed

    def wait_s(self, longest: float, now: float | None = None) -> float:
        """How long the loop may block before :meth:`lost` has something due: at most
        ``longest``."""
        if not self._closed:
            return longest
        now = time.monotonic() if now is None else now
        due = min(self._closed.values()) + self.grace_s - now
        return min(longest, max(0.0, due))

    def lost(
        self, members: Members, closed: Iterable[Peer] = (), now: float | None = None
    ) -> list[tuple[Member, str]]:
        """Take the peers whose connection ``closed`` (the transport's ``lost()``) by
        ``now``; return the members lost by then and why: each closed one once, after
        the grace (peers that are no member, a tool's say, are dropped), and the silent
        one at every call while it stays silent (the caller ends the job)."""
        now = time.monotonic() if now is None else now
        for peer in closed:
            self._closed.setdefault(peer, now)
        out: list[tuple[Member, str]] = []
        for peer, at in list(self._closed.items()):
            if now - at < self.grace_s:
                continue
            del self._closed[peer]
            member = members.by_peer.get(peer)
            if member is not None and not member.finished:
                out.append((member, CLOSED))
        silent = members.silent(now, self.dead_after_s)
        if silent is not None and all(m is not silent for m, _ in out):
            out.append((silent, f"it has been silent for {now - silent.last_seen:.0f}s"))
        return out


def lost_message(member: Member, why: str, current: PlacementMap | None) -> str:
    """What the job says when ``member`` is lost for ``why`` and the job ends: a server
    with the chunks it owned under the ``current`` map (None before the first map), a
    worker with its rank. Pure."""
    owners = current.owners if current is not None else None
    name = f"{member.role.value} {member.rank}"
    if member.role is not Role.SERVER:
        return f"{name} was lost: {why}; stopping the job"
    name += f" at {member.addr}" if member.addr else ""
    owned = [c for c, s in enumerate(owners or ()) if s == member.rank]
    if not owned:
        held = "before any chunk was placed" if owners is None else "it owned no chunk"
        return f"{name} was lost: {why} ({held}); stopping the job"
    shown = ", ".join(map(str, owned[:32])) + (" ..." if len(owned) > 32 else "")
    return (
        f"{name} was lost: {why}; the values and optimizer state of chunks {shown} "
        f"({len(owned)} of {len(owners or ())}) were only there: stopping the job"
    )
