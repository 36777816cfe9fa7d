"""A discrete-event cluster simulator that drives the runtime's own policy objects
(placement and PSLD, batching, consistency, detection, scaling) with modelled workers,
servers and links: ``trimtab simulate``. See docs/simulate.md.

The modules, one idea each: :mod:`.cluster` (the modelled machines and the straggler
specs), :mod:`.job` (what a simulated job is), :mod:`.members` (workers dying and
joining), :mod:`.trace` (a run's records), :mod:`.datapath` (one step through the
data path's queues), :mod:`.decisions` (the policy objects, each call timed),
:mod:`.engine` (the event loop of a synchronous job), :mod:`.asynchronous` (of an
asynchronous one), :mod:`.report` (a run's figures), :mod:`.scenarios` (the
experiments' stragglers at any size, the policy pairs), :mod:`.command` (the command
line), :mod:`.plot` (throughput against size), :mod:`.validate` (against the test bed).

Never imported by the runtime; imports no torch, no sockets, no roles.
"""
