"""What the CUDA decode step takes: its fused weights, and the models and weights it cannot run.

Owns: `fuse_weights` (q/k/v and gate/up concatenated once per layer; the engine's per-matrix
tensors become views of the fused ones, so nothing is held twice; int8 rows stack their scales
alike; a layer's experts stacked), `unsupported(spec)` / `unsupported_weights(weights)` (why a
model or its weights cannot take the fused step: None = they can; what cannot runs the eager
session path -- correct, not fast), `via_dot` / `head_picks` (which projections go through the
step's own dot kernels, and whether its head can pick).  Does not own: the step
(decode_step.py), the graph runner that asks (graph.py).
"""
from __future__ import annotations

import torch

from .triton_moe import stack_experts
from .triton_moe import supported as moe_supported
from .weights_int8 import RowInt8


def _fuse(parts: list) -> tuple:
    """Stacked rows and each part as a view of them; int8 rows stack their scales alike."""
    if isinstance(parts[0], RowInt8):
        q, qs = _fuse([p.q for p in parts])
        s, ss = _fuse([p.scale for p in parts])
        kind = type(parts[0])                       # RowInt8 or BlockInt8: scales stack alike
        return kind(q, s), [kind(a, b) for a, b in zip(qs, ss)]
    fused = torch.cat(parts, dim=0)
    views, at = [], 0
    for p in parts:
        views.append(fused[at:at + p.shape[0]])
        at += p.shape[0]
    return fused, views


def fuse_weights(weights) -> list[dict]:
    """Per layer {'wqkv', 'bqkv', 'wgu'}; rebinds wq/wk/wv/w_gate/w_up (and biases) to views;
    a layer's experts are stacked (triton_moe.stack_experts: the lists become views too)."""
    out = []
    for lw in weights.layers:
        if getattr(lw, "_fused", None) is not None:
            out.append(lw._fused)
            continue
        if lw.wv is None:                          # V = K (Gemma 4 global layers): q | k
            wqkv, (lw.wq, lw.wk) = _fuse([lw.wq, lw.wk])
        else:
            wqkv, (lw.wq, lw.wk, lw.wv) = _fuse([lw.wq, lw.wk, lw.wv])
        bqkv = None
        if lw.bq is not None:
            bqkv, (lw.bq, lw.bk, lw.bv) = _fuse([lw.bq, lw.bk, lw.bv])
        wgu = None
        if lw.w_gate is not None:                  # experts only (gpt-oss): no dense MLP
            wgu, (lw.w_gate, lw.w_up) = _fuse([lw.w_gate, lw.w_up])
        if lw.moe is not None:
            stack_experts(lw.moe)
        lw._fused = {"wqkv": wqkv, "bqkv": bqkv, "wgu": wgu}
        out.append(lw._fused)
    return out


def unsupported(spec) -> str | None:
    """Why this model cannot take the fused step (None = it can)."""
    if spec.qk_norm and spec.norm != "rms":
        return "qk-norm with layer norm"
    if spec.head_dim % 2:
        return f"odd head_dim {spec.head_dim}"
    if spec.num_heads % spec.num_kv_heads:
        return "heads not a multiple of kv heads"
    # What the step has no kernels for runs the eager session path (correct, not fast).
    if any(not l.owns_plane for l in spec.layers):
        return "KV-shared layers"
    if any(l.kv_heads and spec.num_heads % l.kv_heads for l in spec.layers):
        return "heads not a multiple of a layer's kv heads"
    if any(l.k_eq_v and spec.attention_bias for l in spec.layers):
        return "V = K with attention biases"
    if spec.per_layer_input:
        return "per-layer input embeddings (Gemma 4 E2B / E4B)"
    if spec.qk_norm_span not in ("head", "all"):
        return f"qk-norm over {spec.qk_norm_span!r}"
    if not spec.pre_norm and spec.parallel_block:
        return "a post-norm parallel block"
    return None


def unsupported_weights(weights) -> str | None:
    """Why these weights cannot take the fused step (quantized CPU experts, say)."""
    for i, lw in enumerate(weights.layers):
        if lw.moe is not None and not moe_supported(lw.moe):
            return f"layer {i}: experts that are not plain tensors"
    return None


def via_dot(w, what: str, gemv_for, one_row_only: bool, rows: int) -> bool:
    """Whether projection `what` ("qkv", "o", "down", "gu", "head") of `rows` rows goes through
    the step's own dot kernels (`DecodeStep._dot`): int8 rows always (only dot_rows scales
    them); else contiguous rows named in `gemv_for` (MUSER_GEMV), one row only where the kernel
    is the batch-1 gemv (`one_row_only`).  Elsewhere torch computes it (F.linear, tf.logits)."""
    return isinstance(w, RowInt8) or (what in gemv_for and w.is_contiguous()
                                      and (rows == 1 or not one_row_only))


def head_picks(spec, output, gemv_for) -> bool:
    """Whether a step's head can pick (`DecodeStep.head_pick`): it goes through dot_rows (int8
    rows, or contiguous rows with the head among `gemv_for`, MUSER_GEMV=dot) and the logits are
    its values -- no logit scale (Cohere2) or final soft-cap (Gemma 2) between them and the
    pick, which would have to be repeated in the kernel with torch's roundings."""
    return (spec.logit_scale == 1.0 and not spec.final_logit_softcap
            and via_dot(output, "head", gemv_for, False, 1))
