"""Benchmark suite builders, TF workload models and the GPU benchmark harness (importable from tests and scripts)."""
