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
