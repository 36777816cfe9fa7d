"""PSLD: parameter-server load balancing from measured server speeds (pure policies).

The coordinator feeds a :class:`PsldController` what the servers report (cumulative busy
seconds and bytes handled, see :class:`SpeedEstimator`) and what the workers report
(step times), and asks it at step boundaries whether to move chunks. The controller's
decisions come from :func:`rebalance`, a pure function of chunk sizes, owners and
speeds:

* **exploitation**: the predicted time of a server is the bytes it handles per step over
  its measured speed; chunks move, best fit first, from the server predicted slowest to
  the one where they finish soonest, while that lowers the slowest server's time;
* **significance**: servers whose speed figures lie within twice their standard
  error (from the scatter of their windows or steps) of the median figure plan as
  equally fast: on a shared machine a figure moves by a fifth from step to step, and
  plans made on that scatter shuffled chunks among equally fast servers every few
  steps;
* **cost-awareness**: a plan is kept only if the time it saves over the next
  ``horizon`` steps beats the time its migration takes (the moved bytes at the speeds of
  the two servers involved);
* **rollback**: after a plan is applied the controller compares the measured step time
  over the next ``window`` steps with the one before; a plan that made things worse by
  more than ``tolerance`` is undone, unless the speeds measured meanwhile blame a server
  that slowed down since (the old map would be slower too);
* **trust**: a server carrying less than half the median load receives at most up to
  the median in one plan (its speed was measured on a light load);
* **exploration**: after ``explore_every`` steps without a change, one chunk moves
  from the slowest server to the least loaded one when the model cannot rule that out
  (it predicts the step within ``explore_slack`` either way): its figure, measured on a
  light load, is the least certain. The move is kept only if the measured step time
  improved, else rolled back (and not tried again soon);
* **one fewer server**: with more active servers than the job started with, that
  quiet period may instead try the map without the slowest server (every chunk off it)
  when the others are predicted to carry its load within ``explore_slack``: kept if
  the measured step is no slower (a server freed for the same speed), else rolled back.
  A server left with nothing is retired once it is known to straggle for good (found
  slow each time it was re-measured; :mod:`trimtab.policies.scaling`).

Nothing here does I/O or keeps time; every input is an argument, so the same code runs
in the coordinator and in unit tests. The package: :mod:`.model` (the predicted times,
:func:`rebalance` and the one-move plans), :mod:`.speeds` (:class:`SpeedEstimator`),
:mod:`.controller` (:class:`PsldController`). Server scaling, which reads the same
figures, is :mod:`trimtab.policies.scaling`'s.
"""

from trimtab.policies.psld.controller import DECIDE_EVERY, PsldController
from trimtab.policies.psld.model import (
    MIN_SPEED,
    Plan,
    chunk_costs,
    drain_move,
    explore_move,
    fewest_moves,
    rebalance,
    seconds,
    server_times,
    slowest,
)
from trimtab.policies.psld.speeds import LASTING_RECHECKS, SpeedEstimator

__all__ = [
    "DECIDE_EVERY",
    "LASTING_RECHECKS",
    "MIN_SPEED",
    "Plan",
    "PsldController",
    "SpeedEstimator",
    "chunk_costs",
    "drain_move",
    "explore_move",
    "fewest_moves",
    "rebalance",
    "seconds",
    "server_times",
    "slowest",
]
