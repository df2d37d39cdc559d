"""The transformer as plain functions of tensors (gpt-fast style), device-free.

Owns: the per-token wiring of every supported architecture -- embedding (and
Gemma 4's per-layer inputs), q/k/v projection (V = K, KV-shared layers that
project q only), qk-norm (per head, or over all heads: OLMo 3), the value norm
(Gemma 4), RoPE where the layer has it (NoPE layers skip it), the feed-forward
(MLP, experts via `moe.py`, or both), the residual wiring (pre-norm, Gemma
sandwich, post-norm only, Cohere parallel, layer scalar), the output head
(soft-cap, logit scale) and `forward_reference`, the full-recompute oracle.
Each element-wise piece runs through an ops table (`ops.Ops`; default
`ops.EAGER`).
Does not own: the element-wise pieces, the ops table and RoPE tables / rotation
(moved to `ops.py`: `Ops`, `EAGER`, `norm`, `norm_rope`, `act_mul`, `residual`,
`rope_tables`, `rope_rows_asked`, `rope_rows_context`, `rope_for`,
`apply_rope`), any KV storage or attention over stored keys (`layer_forward`
hands this layer's fresh q/k/v to the caller's `attend` callback, which stores
k/v wherever it keeps them and returns the attention output), or which device
runs what (muser.backends supplies the ops table: native CPU kernels, Triton
row kernels on CUDA).  Which layer is sliding, its window and its RoPE base
come from the spec, never from here.  Nothing here asks what device a tensor
is on.

Dtypes: matmuls run in the weights' dtype; norms, RoPE and the logits run in
float32 (the numerics need it), each casting back to the activation dtype.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from muser.config import LayerSpec, ModelSpec
from muser.model import moe
from muser.model.ops import EAGER, Ops, _act, rope_for
from muser.model.weights import LayerWeights, Weights

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T (+ b); `w` is a float matrix or a callable fast linear (quantize.FastLinear)."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, b)
    y = w(x)
    return y if b is None else y + b


def mlp(lw: LayerWeights, spec: ModelSpec, x: torch.Tensor, ops: Ops = EAGER) -> torch.Tensor:
    if lw.w_gate_up is not None:
        gate, up = linear(x, lw.w_gate_up).chunk(2, dim=-1)
        return linear(ops.act_mul(gate, up, spec), lw.w_down)
    return linear(ops.act_mul(linear(x, lw.w_gate), linear(x, lw.w_up), spec), lw.w_down)


def feed_forward(lw: LayerWeights, spec: ModelSpec, h: torch.Tensor, x: torch.Tensor,
                 ops: Ops = EAGER) -> torch.Tensor:
    """The block after attention, before its residual add.  x = the normed input the MLP
    reads; h = the residual stream (Gemma 4's router and experts read it, with their own norms).
    Dense MLP; gpt-oss: experts instead of the MLP; Gemma 4: MLP and experts side by side."""
    if lw.moe is None:
        return mlp(lw, spec, x, ops)
    mw, ms = lw.moe, spec.moe
    if ms.style == "gpt_oss":
        return ops.experts(mw, ms, x, *moe.route(mw, ms, x))
    dense = ops.norm(mlp(lw, spec, x, ops), mw.post_dense_norm, spec)
    weights, idx = moe.route(mw, ms, ops.norm(h, mw.router_norm, spec))
    routed = ops.experts(mw, ms, ops.norm(h, mw.pre_moe_norm, spec), weights, idx)
    return dense + ops.norm(routed, mw.post_moe_norm, spec)


# ----------------------------------------------------------------------------- model
def embed(weights: Weights, spec: ModelSpec, ids: torch.Tensor) -> torch.Tensor:
    """ids [T] int64 -> h [T, hidden] in the weights' dtype.  A table that reads its own rows
    (`rows`: CUDA's EmbedBlocks, a tied head's exact Q8_0 blocks) gives the float table's."""
    table = weights.embed
    h = table.rows(ids) if hasattr(table, "rows") else F.embedding(ids, table)
    if spec.embed_scale != 1.0:
        # Gemma rounds the scale to the activation dtype first (bf16: sqrt(640) -> 25.25)
        h = h * torch.tensor(spec.embed_scale, dtype=h.dtype)
    return h


def per_layer_inputs(weights: Weights, spec: ModelSpec, ids: torch.Tensor, h: torch.Tensor, ops: Ops = EAGER):
    """Gemma 4's per-layer inputs (PLE): [T, L, P] in h's dtype, or None for other models.
    (proj(h) / sqrt(hidden), RMS-normed per layer, + table[ids] * sqrt(P)) / sqrt(2);
    `h` is the scaled main embedding of the same rows."""
    if not spec.per_layer_input:
        return None
    T, L, P = h.shape[0], spec.num_layers, spec.per_layer_input
    proj = linear(h, weights.per_layer_proj) * spec.hidden_size ** -0.5
    proj = ops.norm(proj.reshape(T * L, P), weights.per_layer_norm, spec).reshape(T, L, P)   # rows of P
    table = F.embedding(ids, weights.per_layer_embed).reshape(T, L, P)
    table = table * torch.tensor(P ** 0.5, dtype=table.dtype)     # rounded to the table's dtype, as transformers
    return ((proj + table.to(proj.dtype)) * 2.0 ** -0.5).to(h.dtype)


_ONES: dict = {}


def _unit(d: int, device) -> torch.Tensor:
    """float32 ones [d]: the multiplier of an unscaled RMS norm (Gemma 4's value norm)."""
    key = (d, torch.device(device))
    if key not in _ONES:
        _ONES[key] = torch.ones(d, dtype=torch.float32, device=device)
    return _ONES[key]


def _project_qkv(lw: LayerWeights, spec: ModelSpec, ls: LayerSpec, x: torch.Tensor):
    """q [T, H, D] and, for a layer that owns a plane, k and v [T, KV, D] (else None)."""
    T = x.shape[0]
    H, KV, D = spec.num_heads, ls.kv_heads, ls.head_dim
    has_k, has_v = ls.owns_plane, ls.owns_plane and not ls.k_eq_v
    if lw.wqkv is not None:
        sizes = (H * D,) + ((KV * D,) if has_k else ()) + ((KV * D,) if has_v else ())
        parts = linear(x, lw.wqkv).split(sizes, dim=-1)
        q, k, v = parts[0], parts[1] if has_k else None, parts[2] if has_v else None
    else:
        q = linear(x, lw.wq, lw.bq)
        k = linear(x, lw.wk, lw.bk) if has_k else None
        v = linear(x, lw.wv, lw.bv) if has_v else None
    if ls.k_eq_v:
        v = k                                       # Gemma 4 global layers: V is K before its norm
    q = q.reshape(T, H, D)
    if k is not None:
        k, v = k.reshape(T, KV, D), v.reshape(T, KV, D)
    return q, k, v


def _norm_rope_qk(lw: LayerWeights, spec: ModelSpec, q, k, cos, sin, ops: Ops):
    """qk-norm (per head, or over all heads: OLMo 3) then RoPE."""
    if spec.qk_norm and spec.qk_norm_span == "all":
        q = ops.norm(q.reshape(q.shape[0], -1), lw.q_norm, spec).view(q.shape)
        k = None if k is None else ops.norm(k.reshape(k.shape[0], -1), lw.k_norm, spec).view(k.shape)
        return (ops.norm_rope(q, None, spec, cos, sin),
                None if k is None else ops.norm_rope(k, None, spec, cos, sin))
    q = ops.norm_rope(q, lw.q_norm if spec.qk_norm else None, spec, cos, sin)
    k = None if k is None else ops.norm_rope(k, lw.k_norm if spec.qk_norm else None, spec, cos, sin)
    return q, k


def layer_forward(lw: LayerWeights, spec: ModelSpec, ls: LayerSpec, h: torch.Tensor,
                  positions: torch.Tensor, attend: Attend, rope_memo: dict | None = None,
                  ops: Ops = EAGER, per_layer_input: torch.Tensor | None = None) -> torch.Tensor:
    """One decoder layer.  h [T, hidden], positions [T] int64 -> h [T, hidden].

    `attend(q [T,H,D], k [T,KV,D], v [T,KV,D]) -> [T,H,D]` receives q/k already
    qk-normed and rotated (NoPE layers: not rotated) and v as projected (Gemma 4:
    RMS-normed).  A KV-shared layer (ls.kv_source) passes k = v = None: the caller
    attends over the source layer's keys.  The caller also supplies the layer's
    sinks (lw.sinks) and softmax scale (spec.layer_scale(ls)).
    `rope_memo`: see `rope_for` (one dict per forward pass, shared by its layers).
    `ops`: the element-wise pieces (a backend's table; default the eager maths).
    `per_layer_input`: this layer's slice [T, P] of `per_layer_inputs` (Gemma 4).
    """
    T = h.shape[0]
    x = ops.norm(h, lw.attn_norm, spec) if spec.pre_norm else h
    q, k, v = _project_qkv(lw, spec, ls, x)
    cos, sin = rope_for(spec, ls, positions, rope_memo, ops) if ls.rope else (None, None)
    q, k = _norm_rope_qk(lw, spec, q, k, cos, sin, ops)
    if v is not None and spec.v_norm:
        v = ops.norm_rope(v, _unit(v.shape[-1], v.device), spec, None, None)
    a = attend(q, k, v)                                            # [T, H, D]
    o = linear(a.reshape(T, -1).to(h.dtype), lw.wo, lw.bo)        # [T, hidden]
    if spec.parallel_block:                                        # Cohere: both read the same x
        return ops.residual(h, o, spec, d2=mlp(lw, spec, x, ops))[0]
    post = spec.sandwich_norm or not spec.pre_norm                 # Gemma / OLMo 3 / EXAONE 4: norm o and m
    h, x = ops.residual(h, o, spec, lw.post_attn_norm if post else None, lw.pre_ffn_norm if spec.pre_norm else None)
    m = feed_forward(lw, spec, h, h if x is None else x, ops)
    h = ops.residual(h, m, spec, lw.post_ffn_norm if post else None)[0]
    if per_layer_input is not None:                                # Gemma 4 PLE: gated per-layer residual
        g = _act(linear(h, lw.ple_gate), spec) * per_layer_input
        h = ops.residual(h, linear(g, lw.ple_proj), spec, lw.ple_norm)[0]
    if lw.layer_scale is not None:
        h = h * lw.layer_scale
    return h


def final_hidden(weights: Weights, spec: ModelSpec, h: torch.Tensor, ops: Ops = EAGER) -> torch.Tensor:
    return ops.norm(h, weights.final_norm, spec)


def logits(weights: Weights, spec: ModelSpec, h_normed: torch.Tensor) -> torch.Tensor:
    """h_normed [T, hidden] -> float32 [T, vocab], logit scale and final soft-cap applied."""
    return finish_logits(linear(h_normed, weights.output), spec)


def finish_logits(raw: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """The head's output [T, vocab] -> float32 logits: logit scale, then the final soft-cap."""
    out = raw.float()
    if spec.logit_scale != 1.0:
        out = out * spec.logit_scale
    if spec.final_logit_softcap:
        cap = spec.final_logit_softcap
        out = torch.tanh(out / cap) * cap
    return out


# ----------------------------------------------------------------------------- oracle
def forward_reference(weights: Weights, spec: ModelSpec, ids, all_logits: bool = True,
                      ops: Ops = EAGER) -> torch.Tensor:
    """Full recompute over `ids` with the reference attention (no cache): float32 logits
    [T, vocab] (or [1, vocab] for the last token).  The specification other paths are tested
    against (with the eager ops unless told otherwise)."""
    from muser.attention.reference import attention, visibility_mask
    dev = weights.device
    ids = torch.as_tensor(ids, dtype=torch.long, device=dev)
    pos = torch.arange(ids.shape[0], device=dev)
    h = embed(weights, spec, ids)
    ple = per_layer_inputs(weights, spec, ids, h, ops)
    memo: dict = {}
    kv: dict[int, tuple] = {}                   # layer -> its (k, v): what KV-shared layers read
    for i, (lw, ls) in enumerate(zip(weights.layers, spec.layers)):
        mask = visibility_mask(pos, pos, ls.window)

        def attend(q, k, v, mask=mask, ls=ls, lw=lw):
            if k is None:
                k, v = kv[ls.kv_source]
            else:
                kv[ls.index] = (k, v)
            return attention(q, k, v, mask, spec.layer_scale(ls), spec.attn_logit_softcap, lw.sinks)
        h = layer_forward(lw, spec, ls, h, pos, attend, memo, ops, None if ple is None else ple[:, i])
    if not all_logits:
        h = h[-1:]
    return logits(weights, spec, final_hidden(weights, spec, h, ops))
