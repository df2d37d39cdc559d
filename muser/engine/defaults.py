"""Default run settings per device: the fastest choice that keeps the accuracy contract.

Owns: `default_dtype` and `default_quant`.  Measured in benchmarks/RESULTS.md;
change them only with a measurement.
"""
from __future__ import annotations


def default_dtype(device: str, backend: str = "ring") -> str:
    if backend == "oracle":
        return "float32"
    return "bfloat16"


def default_quant(device: str, dtype: str, backend: str = "ring") -> str:
    """CPU ring: int8 weights (bf16 activations) -- ~1.7x the decode rate of bf16 weights, logits
    within 0.05 of f32's range, greedy agreement up to documented near-ties (test_fast_path)."""
    if backend == "ring" and str(device) == "cpu" and dtype == "bfloat16":
        return "int8"
    return "none"
