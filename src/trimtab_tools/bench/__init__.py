"""Benchmarks for trimtab's datapath and the baselines it is measured against."""
