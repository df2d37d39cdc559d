"""RoPE frequency schedules: a layer's inverse frequencies and its cos/sin amplitude.

Owns: `inv_freq(theta, scale, scaling, head_dim)` -> (float32 [head_dim / 2], attention
factor) for every schedule a `LayerSpec` can name: plain, linear (`scale`), YaRN,
proportional and llama3 (`config.RopeScaling`).  Computed the way transformers' `ROPE_INIT_FUNCTIONS`
do (float32 frequencies from the same formulas), so angles agree with the oracle.
Does not own: which layer uses which schedule (the layer map, `spec.py`) or applying
the rotation (`ops.apply_rope`, the native and Triton kernels).

The rotation is always half-rotation or interleaved over the whole head: a schedule
that leaves some dims unrotated (proportional) gives them frequency 0, i.e. cos 1 and
sin 0, which every kernel passes through exactly (x * 1 - y * 0 == x).
"""
from __future__ import annotations

import math

import torch

from muser.config import RopeScaling


def inv_freq(theta: float, scale: float, scaling: RopeScaling | None, head_dim: int,
             device=None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies float32 [head_dim // 2], amplitude multiplying cos and sin)."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim   # [D/2]
    if scaling is None:
        inv = 1.0 / (theta ** exps)
        return (inv / scale if scale != 1.0 else inv), 1.0
    if scaling.kind == "proportional":
        # transformers' _compute_proportional_rope_parameters: the first int(partial * D / 2)
        # angles use exponents 2i / D of the full head; the remaining angles do not rotate.
        rotated = int(scaling.partial * head_dim // 2)
        inv = 1.0 / (theta ** exps)
        inv[rotated:] = 0.0
        return (inv / scaling.factor if scaling.factor != 1.0 else inv), 1.0
    if scaling.kind == "yarn":
        return _yarn(theta, scaling, head_dim, exps)
    if scaling.kind == "llama3":
        return _llama3(1.0 / (theta ** exps), scaling), 1.0
    raise ValueError(f"unknown RoPE scaling {scaling.kind!r}")


def _yarn(theta: float, s: RopeScaling, dim: int, exps: torch.Tensor) -> tuple[torch.Tensor, float]:
    """transformers' _compute_yarn_parameters (partial_rotary_factor 1)."""
    factor = s.factor
    if s.attention_factor is not None:
        amp = float(s.attention_factor)
    else:
        amp = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_context / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                                   # transformers: avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=exps.device) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** exps
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp                                     # 1: extrapolate (high-frequency dims)
    return interpolation * (1 - keep) + extrapolation * keep, amp


def _llama3(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """transformers' _compute_llama3_parameters."""
    low_wavelen, high_wavelen = s.original_context / s.low_freq, s.original_context / s.high_freq
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_context / wavelen - s.low_freq) / (s.high_freq - s.low_freq)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)
