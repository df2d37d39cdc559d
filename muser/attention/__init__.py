"""muser.attention: the attention arithmetic, selected per device.

Owns: `select_attention(device)` -> a function
`(q [T,H,D], k [S,KV,D], v [S,KV,D], mask bool [T,S] | None, scale, softcap) -> [T,H,D]`.
`reference.py` is the specification; faster paths (fused CPU, Triton on CUDA)
must agree with it and are tested against it.  On CUDA the function is a
`cuda_prefill.CudaAttention`, which also offers `banded(...)` (the window rule
stated as positions, for flash attention without a dense mask); decode steps
on CUDA use `triton_decode` through the engine's graph runner.
"""
from __future__ import annotations

import torch

from .reference import attention as reference_attention


def _reference(q, k, v, mask, scale, softcap=None):
    if mask is None:
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device)
    return reference_attention(q, k, v, mask, scale, softcap)


def select_attention(device: torch.device):
    if torch.device(device).type == "cuda":
        from .cuda_prefill import CudaAttention
        return CudaAttention()
    return _reference
