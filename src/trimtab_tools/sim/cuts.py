"""A simulated migration's cut, as ``roles/server/cuts.py`` cuts a real one, and the
workers' figures of a step so cut (pure; every input is an argument).

A server cuts a chunk leaving it at the round in progress when no push of that round
reached it before the new map did. Its inbound link is a queue (the test bed's ``tbf``,
a NIC's ring): the map comes in after every push that entered the queue before it, so
the race is to the queue, not to a push's last byte (until issue 38's sixth round the
simulator raced the push's last byte, 13 ms over the bed's slow link, and so won nearly
every race that the bed lost). So cut, it answers that step's pushes of the chunk *moved*
(the workers send them again to the new owner) and hands the chunk over at once, its
last round answered. A worker then takes no figure of that server for the step
(``frontend/pusher.py``'s ``take_traffic``): the pushes it turned away crossed its
link within the span it times, so leaving their bytes out made a server that kept few
chunks read several times slower than it is (issue 38: on the bed 8 to 11 MB/s against
21 to 26, and PSLD moved one or two more chunks off it at once), and counting them
made one relieved of chunks read faster. Else the chunk is cut after that round, and
the step runs as if nothing moved.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from trimtab_tools.sim.datapath import StepInput, StepTimes, step_times

__all__ = ["cut_now", "handover_rates", "seen_when_cut"]


def cut_now(moving: np.ndarray, was: np.ndarray, queued: np.ndarray, reached: float) -> np.ndarray:
    """Of chunks ``moving`` (owned by ``was``, per chunk), those cut at the round in
    progress: the new map entered their server's inbound queue (``reached``) before
    the step's first push there did (``queued``, per server:
    ``StepTimes.first_queued``). A map queued behind a push is read after it (a FIFO),
    however long that push takes to come in over a slow link."""
    handed: np.ndarray = moving[queued[was[moving]] > reached]
    return handed


def seen_when_cut(x: StepInput, handed: np.ndarray) -> StepTimes:
    """The step of ``x`` as its workers' figures show it when chunks ``handed`` were
    cut at its round: their pushes answered moved (``StepInput.moved``)."""
    mask = np.zeros(x.sizes.size, dtype=bool)
    mask[handed] = True
    return step_times(dataclasses.replace(x, moved=mask))


def handover_rates(
    nic_bps: float, cap: np.ndarray, link: np.ndarray, was: np.ndarray, now: np.ndarray
) -> np.ndarray:
    """The rate each moving chunk crosses from its server in ``was`` to its server in
    ``now``: the slower of the two servers' caps and links, at most a NIC's."""
    rate: np.ndarray = np.minimum(
        nic_bps, np.minimum(np.minimum(cap[was], cap[now]), np.minimum(link[was], link[now]))
    )
    return rate
