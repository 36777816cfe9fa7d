"""Experiments: whole jobs run side by side, printing machine-readable results."""
