"""Benchmarks and experiments for trimtab: not part of the runtime, which never imports
them; reached through ``trimtab bench`` and ``trimtab experiment``."""
