"""Fault injection for experiments and tests (slow servers, slow workers), wired in by the
launcher and the CLI around the roles, never from inside them."""
