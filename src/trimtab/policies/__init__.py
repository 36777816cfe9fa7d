"""Pure policies: each decides from a snapshot of measurements, imports no torch, zmq or
msgpack, and is picked by name from a registry (placement, consistency, batch sizing,
straggler detection, PSLD rebalancing)."""
