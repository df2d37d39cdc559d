"""Default run settings per device: the fastest choice that keeps the accuracy contract.

Owns: `default_dtype` and `default_quant`.  Measured in benchmarks/RESULTS.md;
change them only with a measurement.
"""
from __future__ import annotations


def default_dtype(device: str, backend: str = "ring") -> str:
    if backend == "oracle":
        return "float32"
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def default_quant(device: str, dtype: str, backend: str = "ring") -> str:
    return "none"
