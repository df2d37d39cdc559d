"""Top-k mixture of experts: routing and the expert feed-forwards, deterministically.

Owns: `route` (which k experts each token takes and with what weight) and `experts`
(each token's weighted sum over its k experts) for the two styles a `MoeSpec` names
(gpt-oss, Gemma 4).  Does not own: the norms around the block or how its output
joins the residual (`transformer.feed_forward`), nor loading (the loaders build
`weights.MoeWeights`).

Determinism (the "one arithmetic per token" rule): a token's output depends on
its own row only.  Tokens are grouped by expert in ascending expert order
(a stable sort, so token order inside a group), each group runs its expert's
matmuls, and every (token, slot) result is written to its own row of a
[T * k, hidden] buffer -- written once, never accumulated, so there is no
index_add race.  The k slots of a token are then summed in slot order (top-k
rank order), in float32, by plain elementwise adds.  With a row-invariant expert
kernel (the CPU int8 path) a token's bits do not depend on which other tokens
share the step.  Dense float kernels are not row-invariant (BLAS picks kernels by
the row count), and a group's row count depends on how the OTHER tokens of the
chunk were routed: so for short chunks (<= FIXED_ROWS_MAX rows: verification
blocks, chat suffixes) each expert runs on all T rows of the chunk, zeros where
its tokens are not -- the same matmul shape whatever the routing, which is what
makes a rolled-back block bitwise equal to consuming only the kept tokens.
Long chunks keep the grouped shapes (fixed for a given chunking: restores
replay bitwise).  On CUDA in bf16/f16 the backend runs backends/cuda/triton_moe.py instead
(experts grouped on the device in fixed tiles: rows invariant at every chunk size).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from muser.config import MoeSpec
from muser.model.weights import MoeWeights

FIXED_ROWS_MAX = 64     # chunks up to this many rows run dense-float experts at a routing-independent shape


def _linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, b)
    y = w(x)
    return y if b is None else y + b


def route(mw: MoeWeights, ms: MoeSpec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, hidden] (the router's input, already normed where the style norms it)
    -> (weights float32 [T, k], expert ids int64 [T, k]); ties go to the lower expert id."""
    logits = _linear(x, mw.router, mw.router_bias).float()                  # [T, E]
    if ms.style == "gpt_oss":
        # softmax over the k largest logits only
        top, idx = torch.topk(logits, ms.top_k, dim=-1)
        return torch.softmax(top, dim=-1), idx
    if ms.style == "gemma4":
        probs = torch.softmax(logits, dim=-1)
        top, idx = torch.topk(probs, ms.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        if mw.expert_scale is not None:
            top = top * mw.expert_scale.float()[idx]
        return top, idx
    raise ValueError(f"unknown MoE style {ms.style!r}")


def _expert(mw: MoeWeights, ms: MoeSpec, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert e on rows x [n, hidden] -> [n, hidden] float32."""
    if mw.w_gate_up is not None:
        gate, up = _linear(x, mw.w_gate_up[e]).chunk(2, dim=-1)
    else:
        gate, up = _linear(x, mw.w_gate[e]), _linear(x, mw.w_up[e])
    if ms.style == "gpt_oss":
        gate = gate.float() + mw.b_gate[e].float()
        up = up.float() + mw.b_up[e].float()
        gate = gate.clamp(max=ms.swiglu_limit)
        up = up.clamp(min=-ms.swiglu_limit, max=ms.swiglu_limit)
        act = (up + 1) * (gate * torch.sigmoid(gate * ms.swiglu_alpha))
        out = _linear(act.to(x.dtype), mw.w_down[e]).float()
        return out + mw.b_down[e].float()
    act = F.gelu(gate, approximate="tanh") * up
    return _linear(act, mw.w_down[e]).float()


def experts(mw: MoeWeights, ms: MoeSpec, x: torch.Tensor, weights: torch.Tensor,
            idx: torch.Tensor) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{idx[t, j]}(x[t]) for each token t -> [T, hidden] in x's dtype."""
    T, k = idx.shape
    flat = idx.reshape(-1)                                                   # [T * k]: expert of (t, j)
    order = torch.argsort(flat, stable=True)                                 # grouped by expert
    counts = torch.bincount(flat, minlength=ms.num_experts).tolist()
    buf = torch.empty((T * k, x.shape[-1]), dtype=torch.float32, device=x.device)
    fixed = T <= FIXED_ROWS_MAX and isinstance(mw.w_down[0], torch.Tensor)
    at = 0
    for e, c in enumerate(counts):                                           # ascending expert id
        if c == 0:
            continue
        rows = order[at:at + c]                                              # (t, j) pairs, t ascending
        tokens = rows // k
        if fixed:                                                            # [T, hidden], zeros elsewhere
            xin = torch.zeros_like(x).index_copy_(0, tokens, x[tokens])
            buf[rows] = _expert(mw, ms, e, xin)[tokens]
        else:
            buf[rows] = _expert(mw, ms, e, x[tokens])
        at += c
    buf = buf.view(T, k, -1) * weights.view(T, k, 1)
    out = buf[:, 0]
    for j in range(1, k):                                                    # slot order, elementwise
        out = out + buf[:, j]
    return out.to(x.dtype)
