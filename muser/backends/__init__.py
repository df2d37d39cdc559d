"""muser.backends: the device's wing of an engine, chosen once per Engine.

    base.py        Backend: ops table, attention, weight preparation, step driver
    step.py        the one forward: 1..B sessions x 1..k rows (decode, verify, prefill chunk,
                   batched decode are the same call with different shapes), transactional
    reference.py   eager maths + reference attention: the float32 oracle, other devices
    defaults.py    the fastest accurate dtype / weight path / prefill chunk per device; check(config)
    cpu/           native C kernels (model/native.py), int8 weights, CPU attention routes
    cuda/          Triton row and decode kernels, captured decode steps, flash attention

Owns: `select(config, env)`, the one place that asks which device an engine runs
on.  Does not own: the maths (muser.model.transformer), planes (muser.cache).
"""
from __future__ import annotations

import torch

from ..config import EngineConfig
from ..env import Env
from .base import Backend
from .defaults import check


def select(config: EngineConfig, env: Env) -> Backend:
    """oracle family -> reference; CUDA -> cuda; CPU -> cpu; any other device -> reference.
    Refuses a combination no backend runs (defaults.check)."""
    check(config)
    device = torch.device(config.device).type
    if config.backend == "oracle":
        from .reference import ReferenceBackend
        return ReferenceBackend(config, env)
    if device == "cuda":
        from .cuda import CudaBackend
        return CudaBackend(config, env)
    if device == "cpu":
        from .cpu import CpuBackend
        return CpuBackend(config, env)
    from .reference import ReferenceBackend
    return ReferenceBackend(config, env)


__all__ = ["Backend", "select"]
