"""Plain-torch attention: the specification every other attention path is tested against.

Owns: masked grouped-query attention over explicit key positions, and the
window rule.  Does not own: where keys come from (the cache) or kernels.

The window rule, for a sliding layer of width W (full layers: W = None):

    query at position p sees key at position k  iff  k <= p  and  k > p - W

    W = 4, p = 9:   keys 6 7 8 9 are visible; 5 and below are not.
"""
from __future__ import annotations

import torch


def visibility_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Bool [T, S]: True where query i may attend key j.  q_pos [T], k_pos [S] (int64)."""
    diff = q_pos[:, None] - k_pos[None, :]          # [T, S]  p - k
    mask = diff >= 0
    if window is not None:
        mask &= diff < window
    return mask


def attention(
    q: torch.Tensor,            # [T, H, D]
    k: torch.Tensor,            # [S, KV, D]
    v: torch.Tensor,            # [S, KV, D]
    mask: torch.Tensor,         # bool [T, S]
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,   # [H] float32 logits (gpt-oss), or None
) -> torch.Tensor:              # [T, H, D], dtype of q
    """Grouped-query attention in float32 with an explicit visibility mask.

    Keys are reduced in the order they are given: callers that promise bitwise
    replay must hand keys over in the same order every time.

    Sinks: head h's learned logit sinks[h] joins every softmax denominator as one
    more "key" with no value: p_j = exp(s_j) / (exp(sinks[h]) + sum_i exp(s_i)).
    A query's weights then sum to less than 1 (the rest is attention to nothing).
    """
    T, H, D = q.shape
    S, KV, _ = k.shape
    group = H // KV
    qf = q.float().reshape(T, KV, group, D).permute(1, 2, 0, 3)      # [KV, G, T, D]
    kf = k.float().permute(1, 2, 0)                                  # [KV, D, S]
    vf = v.float().permute(1, 0, 2)                                  # [KV, S, D]
    scores = torch.matmul(qf, kf.unsqueeze(1)) * scale               # [KV, G, T, S]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(KV, group, 1, 1).expand(KV, group, T, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    # A query row with no visible key (cannot happen for causal self-attention,
    # where a query always sees itself) would be NaN; keep it zero instead.
    probs = torch.nan_to_num(probs, nan=0.0)
    out = torch.matmul(probs, vf.unsqueeze(1))                       # [KV, G, T, D]
    return out.permute(2, 0, 1, 3).reshape(T, H, D).to(q.dtype)
