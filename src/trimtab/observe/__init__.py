"""The live view: everything that reads the coordinator's event stream
(:mod:`trimtab.roles.coordinator.events`): the job's latest figures (:mod:`.state`),
Prometheus metrics (:mod:`.metrics`), the dashboard (:mod:`.dashboard`), run records
(:mod:`.records`) and their reports (:mod:`.report`). It sits above the roles and
never adds a path from them: the roles report to the coordinator as they always did.
Imports no torch (the coordinator's process runs it). The dashboard and metrics need
the ``observe`` extra; records and reports do not (reports need ``plot``'s matplotlib).
"""

from trimtab.observe.settings import ObserveSettings

__all__ = ["ObserveSettings"]
