"""Chunk attention on CUDA: flash attention with the window as a band, no dense mask.

Owns: `CudaAttention`, the CUDA backend's chunk attention.  Called like every
attention path, `(q, k, v, mask, scale, softcap)`;
and, for a staged chunk, `banded(q, k, v, q_start, k_start, window, scale,
softcap)`, which states the visibility rule instead of materialising it:

    query i (position q_start + i) sees key j (position k_start + j)
    iff  k_start + j <= q_start + i  and  q_start + i - (k_start + j) < window

Sinks (gpt-oss) ride on flash's log-sum-exp: `_join_sinks` rescales each row.
Every staged route (in place, detached shadow) ends its keys at the chunk's
last row, so q_start + T == k_start + S: exactly FlashAttention-2's
bottom-right causal alignment, and the window is its `window_size_left =
W - 1`.  That runs through `torch.ops.aten._flash_attention_forward`
(deterministic forward, grouped-query heads native, strided K/V views of a
head-major plane read without a copy).  Anything else -- a soft-cap, float32,
unaligned spans, a torch without that op -- falls back to SDPA over an explicit
mask, which is correct but materialises [T, S]; head dims over 256 (Gemma 4's global
layers) take SDPA without turning flash off for the other layers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...attention.reference import visibility_mask


FLASH_MAX_HEAD_DIM = 256       # FlashAttention-2's limit (Gemma 4's 512-dim global layers: SDPA)


def _sdpa(q, k, v, mask, scale):
    """q [T, H, D], k/v [S, KV, D], mask bool [T, S] | None -> [T, H, D]."""
    H, KV = q.shape[1], k.shape[1]
    if H != KV:
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)


class CudaAttention:
    """The CUDA attention path.  `stats` counts which route each call took."""

    def __init__(self):
        self.flash_ok = hasattr(torch.ops.aten, "_flash_attention_forward")
        self.stats = {"flash": 0, "sdpa": 0, "reference": 0}
        self.last_error: str | None = None

    def __call__(self, q, k, v, mask, scale, softcap=None, sinks=None):
        if softcap is not None or sinks is not None or q.dtype == torch.float32:
            # no CUDA kernel takes sinks yet: the reference arithmetic, on the GPU
            return self._reference(q, k, v, mask, scale, softcap, sinks)
        self.stats["sdpa"] += 1
        return _sdpa(q, k, v, mask, scale).to(q.dtype)

    def _reference(self, q, k, v, mask, scale, softcap, sinks=None):
        from ...attention.reference import attention
        self.stats["reference"] += 1
        if mask is None:
            mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device)
        return attention(q, k, v, mask, scale, softcap, sinks)

    def banded(self, q, k, v, q_start: int, k_start: int, window: int | None, scale: float,
               softcap: float | None = None, sinks: torch.Tensor | None = None):
        T, S = q.shape[0], k.shape[0]
        aligned = q_start + T == k_start + S
        if (self.flash_ok and aligned and softcap is None and q.dtype in (torch.bfloat16, torch.float16)
                and q.shape[-1] <= FLASH_MAX_HEAD_DIM and k.stride(-1) == 1 and v.stride(-1) == 1):
            try:
                out, lse = torch.ops.aten._flash_attention_forward(
                    q[None], k[None], v[None], None, None, T, S, 0.0, True, False, scale=scale,
                    window_size_left=(window - 1) if window is not None else -1,
                    window_size_right=0)[:2]
                self.stats["flash"] += 1
                return out[0] if sinks is None else _join_sinks(out[0], lse[0], sinks)
            except (RuntimeError, TypeError) as e:     # op missing a feature on this build
                self.flash_ok = False
                self.last_error = f"{type(e).__name__}: {e}"[:300]
        qp = torch.arange(q_start, q_start + T, device=q.device)
        kp = torch.arange(k_start, k_start + S, device=q.device)
        return self(q, k, v, visibility_mask(qp, kp, window), scale, softcap, sinks)


def _join_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention without sinks -> with them.  out [T, H, D] = sum_j e^(s_j) v_j / Z, lse [H, T]
    = log Z (float32): a sink logit s_h joins the denominator, so each row scales by
    Z / (Z + e^(s_h)) = sigmoid(lse - s_h), in float32, then rounds once to out's dtype."""
    factor = torch.sigmoid(lse - sinks.float()[:, None]).transpose(0, 1)      # [T, H]
    return (out.float() * factor[:, :, None]).to(out.dtype)
