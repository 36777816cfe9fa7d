"""Fault injection for experiments and tests (slow servers, slow workers), wired in by the
launcher and the CLI around the roles, never from inside them.

- :mod:`.stragglers`: the ``--straggler`` specs (``parse_stragglers``, ``StragglerSpec``,
  ``ENV``, i.e. ``TRIMTAB_STRAGGLERS``) and the per-node schedules.
- :mod:`.throttle`: ``ThrottledTransport``, a transport that paces a server as a slower
  one (bandwidth, delay per byte, competing processes).
- :mod:`.slowdown`: ``WorkerSlowdown``, the step hook that slows a worker down.
"""
