"""Attention on the CPU: the CPU backend's attention.

Owns: `CpuAttention` -- called like every attention path, `(q [T,H,D], k [S,KV,D],
v [S,KV,D], mask bool [T,S] | None, scale, softcap, sinks=None) -> [T,H,D]` (sinks: gpt-oss's
per-head logits [H] joining every softmax denominator; `cpu_attention`:
every key visible (a decode step) through the native kernel, long masked chunks
through PyTorch's fused kernel, the rest through the reference arithmetic) --
and, when the native kernels are built, `positional(...)`: query rows at
absolute positions over keys addressed by position (csrc/attend.c), one
arithmetic per row whether the row is a decode step, a verification row or a
row of any prefill chunk (issue 12).  Does not own: the specification
(muser.attention.reference, which every route is tested against) or the
kernels (muser.model.native).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...attention.reference import attention as reference_attention
from ...model import native


FUSED_MIN_ROWS = 64   # masked chunks with more query rows than this take the fused kernel


def cpu_attention(q, k, v, mask, scale, softcap=None, sinks=None):
    """CPU attention.  Long prefill chunks (> FUSED_MIN_ROWS rows) go through the fused kernel;
    short chunks -- verification blocks, chat suffixes -- keep the reference arithmetic: their
    scores are small, and their bits then do not depend on the fused kernel's row blocking
    (a suffix prefilled onto a cached prefix reproduces a cold prefill bit for bit in the
    server's tests).  Sinks take the same routes: the fused kernel's log-sum-exp gives the
    sink's share exactly (`_fused_masked_sinks`); the decode kernel has no sinks, so a
    decode step with sinks runs the eager arithmetic."""
    if mask is None:
        return _all_visible(q, k, v, scale, softcap, sinks)
    if softcap is None and q.shape[0] > FUSED_MIN_ROWS:
        if sinks is not None:
            return _fused_masked_sinks(q, k, v, mask, scale, sinks)
        return _fused_masked(q, k, v, mask, scale)
    return reference_attention(q, k, v, mask, scale, softcap, sinks)


def _fused_masked(q, k, v, mask, scale):
    """A chunk's masked attention through PyTorch's fused CPU kernel (flash attention with a
    boolean mask): the [T, S] scores are never materialized, which is what long-context
    prefill pays for in the reference (0.89 -> 0.49 s for a 512-row chunk over 32k keys).
    Each output row is reduced over the keys in a fixed blocked order by one thread, so the
    result depends on neither the thread count nor the other rows.  q [T, H, D], k/v [S, KV, D]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)                                  # [T, H, D]


def _fused_masked_sinks(q, k, v, mask, scale, sinks):
    """`_fused_masked` with attention sinks.  The fused kernel also returns each row's
    log-sum-exp L of its scores; adding a sink s to the denominator scales the output by
    e^L / (e^L + e^s) = sigmoid(L - s), exactly.  q [T, H, D], k/v [S, KV, D], sinks [H]."""
    H, KV = q.shape[1], k.shape[1]
    if H != KV:                                                    # the op has no GQA: expand
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))   # [T, S]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], 0.0, False,
        attn_mask=bias, scale=scale)[:2]                           # [1, H, T, D], [1, H, T] f32
    share = torch.sigmoid(lse[0] - sinks.float()[:, None])        # [H, T]
    return (out[0].float() * share[..., None]).transpose(0, 1).to(q.dtype)


def _all_visible(q, k, v, scale, softcap=None, sinks=None):
    """The reference arithmetic when every key is visible (a decode step): no mask to
    build or apply.  q [T, H, D], k/v [S, KV, D] -> [T, H, D].  On CPU one native
    call (muser.model.native, tested against this eager version) when it applies
    (not with sinks: the kernel has none)."""
    if sinks is None:
        out = native.try_attend_visible(q, k, v, scale, softcap)
        if out is not None:
            return out
    T, H, D = q.shape
    KV = k.shape[1]
    qf = q.float().reshape(T, KV, H // KV, D).permute(1, 2, 0, 3)          # [KV, G, T, D]
    scores = torch.matmul(qf, k.float().permute(1, 2, 0).unsqueeze(1)) * scale   # [KV, G, T, S]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if sinks is not None:
        sink = sinks.float().reshape(KV, H // KV, 1, 1).expand(KV, H // KV, T, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.float().permute(1, 0, 2).unsqueeze(1))
    return out.permute(2, 0, 1, 3).reshape(T, H, D).to(q.dtype)


class CpuAttention:
    """The CPU attention path: called like every path (masked / all-visible), plus
    `positional` (None without the native kernels)."""

    def __call__(self, q, k, v, mask, scale, softcap=None, sinks=None):
        return cpu_attention(q, k, v, mask, scale, softcap, sinks)

    @property
    def positional(self):
        return self._positional if native.available() else None

    @staticmethod
    def _positional(q, first_position: int, window: int | None, keys, values, key_pos0: int, count: int,
                    rotation: int, scale: float, softcap: float | None = None, sinks=None):
        """q [T, H, D] at positions first_position .. + T - 1, each row seeing keys
        [max(0, p - window + 1), p]; key position j is row (rotation + j - key_pos0) % len(keys)
        of keys/values [cap, KV, D] (a ring read in place, a growing plane's span or a staged
        shadow), `count` keys held from key_pos0."""
        return native.attend_rows(q, keys, values, first_position, window, key_pos0, scale, softcap,
                                  count=count, rotation=rotation, sinks=sinks)
