"""Benchmarks: collectives, training scaling, trainer against baselines."""
