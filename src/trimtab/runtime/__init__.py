"""What every node process shares above the transport: the event loop's helpers and
heartbeats, tensors on the wire, diagnostics of a hung job."""
