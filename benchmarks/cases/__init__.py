"""Benchmark cases: each runs one workload in a fresh interpreter, prints one RESULT line."""
