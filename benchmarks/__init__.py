"""Benchmark scripts (not tests): `python -m benchmarks.engine`."""
