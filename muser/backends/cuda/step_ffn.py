"""A decode step's feed-forward half and OLMo 3's all-head qk-norm, as functions of the step.

Owns: `ffn(step, ...)` (transformer.feed_forward on the step's kernels: the MLP -- gate|up with
act * up fused in, then down; gpt-oss: experts instead; Gemma 4: both, each with its own norms)
and `norm_all(step, ...)`.  Does not own: the kernels (triton_dot.py, triton_moe.py,
triton_ops.py), which projection goes where (`DecodeStep._linear` / `_dot`, step_weights.via_dot),
the layer loop (decode_step.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .step_norm import ready
from .step_weights import via_dot
from .triton_moe import experts_rows, route_rows
from .triton_ops import add_norm
from .triton_rows import act_mul


def norm_all(step, qkv, lw, hd: int, kd: int):
    """OLMo 3's qk-norm over all heads of q (and of k) at once: qkv with q and k normed."""
    eps, ln = step.spec.norm_eps, step.layernorm
    q = add_norm(qkv[:, :hd].contiguous(), lw.q_norm, eps, ln)[1]
    k = add_norm(qkv[:, hd:hd + kd].contiguous(), lw.k_norm, eps, ln)[1]
    return torch.cat([q, k, qkv[:, hd + kd:]], dim=1)


def experts(step, mw, x_router, x):
    weights, idx = route_rows(x_router, mw, step.spec.moe,
                              lambda v, w, b: step._linear("o", v, w, b))
    return experts_rows(x, mw, step.spec.moe, weights, idx)


def ffn(step, lw, fz, h, x, defer: bool = False):
    """transformer.feed_forward: the MLP; gpt-oss: experts instead; Gemma 4: both, each
    with its own norms (h = the residual stream the experts and their router read).
    `defer`: a plain MLP's down projection may come back as unsummed pieces (`_dot`)."""
    mw = lw.moe
    if mw is None:
        return mlp(step, lw, fz, x, defer=defer)
    if step.spec.moe.style == "gpt_oss":
        return experts(step, mw, x, x)
    eps, ln = step.spec.norm_eps, step.layernorm
    dense = add_norm(mlp(step, lw, fz, x), mw.post_dense_norm, eps, ln)[1]
    routed = experts(step, mw, add_norm(h, mw.router_norm, eps, ln)[1],
                     add_norm(h, mw.pre_moe_norm, eps, ln)[1])
    return dense + add_norm(routed, mw.post_moe_norm, eps, ln)[1]


def mlp(step, lw, fz, x, defer: bool = False):
    """gate|up (act * up fused into dot_rows where it takes the weight), then down."""
    wgu = fz["wgu"]
    if via_dot(wgu, "gu", step.gemv_for, step.batch1_only, x.shape[0]):
        a = step._dot(x, wgu, glu=True, gelu=step.gelu)               # act*mul fused in
    else:
        gu = F.linear(ready(step, x), wgu)              # [B, 2I]: gate | up
        half = gu.shape[1] // 2
        a = act_mul(gu[:, :half], gu[:, half:], step.gelu)
    return step._linear("down", a, lw.w_down, defer=defer)
