"""The CUDA ops table: a chunk's element-wise pieces through Triton row kernels.

Owns: `cuda_ops(rows_fused)`, the `model.ops.Ops` the CUDA backend
runs for chunks (prefill, extend; decode steps run the captured step,
decode_step.py).  With the row kernels (triton_rows.py: Triton installed and
MUSER_ROWS not `eager`), norms, residual add (+ norm), qk-norm + RoPE and
act * up of tensors of one supported dtype are one pass each over a chunk's
rows, and a chunk's experts are two grouped launches (triton_moe.py);
anything else takes the eager maths.  RoPE tables are built for the
whole context, so no step reads a position back to the host.
Does not own: the kernels (triton_rows.py) or the maths (transformer.py).
"""
from __future__ import annotations

import torch

from ...model import moe
from ...model import ops
from ...model.ops import Ops
from . import triton_moe, triton_rows


def _fused(x, *others) -> bool:
    """Tensors of one dtype the row kernels take."""
    return x.dtype in triton_rows.DTYPES and all(o is None or o.dtype == x.dtype for o in others)


def _norm(x, w, spec):
    if _fused(x):
        return triton_rows.norm(x, w, spec.norm_eps, spec.norm != "rms")
    return ops.norm(x, w, spec)


def _norm_rope(x, w, spec, cos, sin):
    if w is None and cos is None:
        return x
    if _fused(x) and x.shape[-1] % 2 == 0:
        return triton_rows.norm_rope(x, w, spec.norm_eps, spec.norm != "rms", cos, sin,
                                     spec.rope_interleaved)
    return ops.norm_rope(x, w, spec, cos, sin, norm_fn=_norm)


def _act_mul(gate, up, spec):
    if _fused(gate, up) and gate.dim() == 2:
        return triton_rows.act_mul(gate, up, spec.activation == "gelu_tanh")
    return ops.act_mul(gate, up, spec)


def _residual(h, d, spec, w_post=None, w_next=None, d2=None):
    if _fused(h, d, d2) and h.dim() == 2:
        return triton_rows.residual(h, d, spec.norm_eps, spec.norm != "rms", w_post, w_next, d2)
    return ops.residual(h, d, spec, w_post, w_next, d2, norm_fn=_norm)


def _experts(mw, ms, x, weights, idx):
    # grouped by expert on the device in 16-row tiles (rows invariant: a token's bits do not
    # depend on the chunk or on how the other tokens routed); float32: moe.py's matmuls
    if x.dtype in (torch.bfloat16, torch.float16) and triton_moe.supported(mw):
        return triton_moe.experts_rows(x, mw, ms, weights, idx)
    return moe.experts(mw, ms, x, weights, idx)


FUSED = Ops(norm=_norm, norm_rope=_norm_rope, act_mul=_act_mul, residual=_residual,
            rope_rows=ops.rope_rows_context, experts=_experts)
EAGER = Ops(norm=ops.norm, norm_rope=ops.norm_rope, act_mul=ops.act_mul, residual=ops.residual,
            rope_rows=ops.rope_rows_context)


def cuda_ops(rows_fused: bool) -> Ops:
    return FUSED if rows_fused else EAGER
