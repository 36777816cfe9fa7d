"""Pure policies: each decides from a snapshot of measurements, imports no torch, zmq or
msgpack, and is picked by name from a registry: placement, consistency, batch sizing,
straggler detection, server scaling, and PSLD's live rebalancing (:mod:`.psld`).

The roles ask a policy what it does (``PlacementPolicy.live``,
``BatchSizingPolicy.adaptive``, ``ConsistencyPolicy.synchronous`` and
``skips_stragglers``) rather than testing its name, so a new policy needs no edit of
the roles."""
