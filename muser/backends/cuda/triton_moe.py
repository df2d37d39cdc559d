"""Mixture of experts for a decode step on CUDA (Triton): grouped by expert, no host sync.

Owns: `stack_experts` (a layer's expert matrices as one [E, out, in] tensor each; the
MoeWeights lists become views of it, so nothing is held twice), `route_rows` (the router,
top-k and the style's weights on the device) and `experts_rows` (each token's weighted sum
over its k experts).  Does not own: the maths they follow (`model/moe.py`, the eager
chunk path and the specification), the decode step that calls them (decode_step.py).

Grouping, without reading anything back to the host (the step is graph-captured):

    idx [B, k] -> pairs p = b * k + j -> `order` = pairs sorted by expert (stable),
    counts[e], first[e] = where e's pairs start in `order`

    grid (column tiles, E): program (n, e) walks e's pairs 16 at a time and
    exits at once when e has none (most programs at batch 1: k of E experts).

Each expert matrix is read once per 16 of its pairs, not once per pair.  Row-invariant
like `triton_ops.dot_rows`: tiles of 16 rows on the tensor cores with K in fixed
BLOCK_K steps, so a pair's sums never see the other rows of its tile -- a session's
logits are bitwise the same decoded alone or beside others, however the others route.
Rounding is moe.py's: each product rounded to the activation dtype, gpt-oss's biases,
clamps and gate in float32, the activation rounded before the down product; every
(token, slot) result goes to its own float32 row; the k slots are summed in slot order.
"""
from __future__ import annotations

import functools

import torch

BLOCK_N = 32
BLOCK_K = 128


def stack_experts(mw) -> dict:
    """{'gu': [E, 2I, hidden], 'down': [E, hidden, I], 'b_gu': [E, 2I] | None} of one layer,
    built once; mw's lists
    (w_gate_up, or w_gate and w_up; w_down) are rebound to views of them."""
    hit = getattr(mw, "_stacked", None)
    if hit is not None:
        return hit
    E = len(mw.w_down)
    if mw.w_gate_up is not None:
        gu = torch.stack(list(mw.w_gate_up))
        mw.w_gate_up = [gu[e] for e in range(E)]
    else:
        gu = torch.stack([torch.cat([g, u]) for g, u in zip(mw.w_gate, mw.w_up)])
        inter = gu.shape[1] // 2
        mw.w_gate = [gu[e, :inter] for e in range(E)]
        mw.w_up = [gu[e, inter:] for e in range(E)]
    down = torch.stack(list(mw.w_down))
    mw.w_down = [down[e] for e in range(E)]
    b_gu = None if mw.b_gate is None else torch.cat([mw.b_gate, mw.b_up], dim=1)   # [E, 2I]
    mw._stacked = {"gu": gu, "down": down, "b_gu": b_gu}
    return mw._stacked


def supported(mw) -> bool:
    """Plain tensors (not the CPU's quantized FastLinear) for every expert matrix."""
    mats = (mw.w_gate_up or []) + (mw.w_gate or []) + (mw.w_up or []) + list(mw.w_down)
    return all(isinstance(m, torch.Tensor) for m in mats)


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def experts_kernel(X, W, BIAS, OUT, ORDER, COUNTS, FIRST, N, K: tl.constexpr,
                       TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GLU: tl.constexpr, GPT_OSS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       alpha, limit, X_PER_PAIR: tl.constexpr):
        # W [E, (2 if GLU) * N, K]; X rows: a token's (X_PER_PAIR False) or a pair's.
        # GLU: OUT[pair] = act(gate) * up (activation dtype); else OUT[pair] = x @ W[e].T (+ b)
        # in float32, the product rounded to the activation dtype first.
        e = tl.program_id(1)
        cnt = tl.load(COUNTS + e)
        if cnt > 0:
            start = tl.load(FIRST + e)
            cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < N
            wbase = W + e.to(tl.int64) * (2 * N if GLU else N) * K
            xdt = X.dtype.element_ty
            for r0 in range(0, cnt, 16):
                rr = r0 + tl.arange(0, 16)
                rmask = rr < cnt
                pair = tl.load(ORDER + start + rr, mask=rmask, other=0)
                row = pair if X_PER_PAIR else pair // TOPK
                acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
                if GLU:
                    accu = tl.zeros((16, BLOCK_N), dtype=tl.float32)
                for k0 in range(0, K, BLOCK_K):
                    ks = k0 + tl.arange(0, BLOCK_K)
                    kmask = ks < K
                    x = tl.load(X + row[:, None].to(tl.int64) * K + ks[None, :],
                                mask=rmask[:, None] & kmask[None, :], other=0.0)
                    wp = wbase + cols[:, None].to(tl.int64) * K + ks[None, :]
                    m2 = cmask[:, None] & kmask[None, :]
                    acc = tl.dot(x, tl.trans(tl.load(wp, mask=m2, other=0.0)), acc)
                    if GLU:
                        accu = tl.dot(x, tl.trans(tl.load(wp + N * K, mask=m2, other=0.0)), accu)
                om = rmask[:, None] & cmask[None, :]
                y = acc.to(xdt).to(tl.float32)                 # the product, rounded (F.linear)
                if GLU:
                    u = accu.to(xdt).to(tl.float32)
                    if GPT_OSS:                                # moe._expert: biases, clamps, gate
                        bg = tl.load(BIAS + e * 2 * N + cols, mask=cmask, other=0.0).to(tl.float32)
                        bu = tl.load(BIAS + e * 2 * N + N + cols, mask=cmask, other=0.0).to(tl.float32)
                        g = tl.minimum(y + bg[None, :], limit)
                        u = tl.minimum(tl.maximum(u + bu[None, :], -limit), limit)
                        a = (u + 1.0) * (g * tl.sigmoid(g * alpha))
                    else:                                      # gelu-tanh(gate) * up, torch's rounding
                        t = 0.7978845608028654 * (y + 0.044715 * y * y * y)
                        a = (0.5 * y * (1.0 + (2.0 * tl.sigmoid(2.0 * t) - 1.0))).to(xdt).to(tl.float32) * u
                    tl.store(OUT + pair[:, None].to(tl.int64) * N + cols[None, :], a.to(xdt), mask=om)
                else:
                    if HAS_BIAS:
                        y = y + tl.load(BIAS + e * N + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
                    tl.store(OUT + pair[:, None].to(tl.int64) * N + cols[None, :], y, mask=om)

    return experts_kernel


def route_rows(x: torch.Tensor, mw, ms, router: torch.Tensor, project) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, hidden] -> (weights float32 [B, k], expert ids int64 [B, k]) as `moe.route` does,
    with the router product through `project(x, w, bias)` (the step's row-invariant matmul)."""
    logits = project(x, router, mw.router_bias).float()                    # [B, E]
    if ms.style == "gpt_oss":
        top, idx = torch.topk(logits, ms.top_k, dim=-1)
        return torch.softmax(top, dim=-1), idx
    probs = torch.softmax(logits, dim=-1)
    top, idx = torch.topk(probs, ms.top_k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    if mw.expert_scale is not None:
        top = top * mw.expert_scale.float()[idx]
    return top, idx


def experts_rows(x: torch.Tensor, mw, ms, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """sum_j weights[b, j] * expert_{idx[b, j]}(x[b]) -> [B, hidden] in x's dtype (moe.experts)."""
    kern = _kernels()
    st = stack_experts(mw)
    gu, down = st["gu"], st["down"]
    B, k = idx.shape
    E, two_i, hidden = gu.shape
    inter = two_i // 2
    x = x.contiguous()
    flat = idx.reshape(-1)                                                   # [B * k]
    order = torch.argsort(flat, stable=True)                                 # pairs by expert
    counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat))
    first = torch.cumsum(counts, 0) - counts
    gpt = ms.style == "gpt_oss"
    b_gu = st["b_gu"]
    act = x.new_empty(B * k, inter)
    kern[(-(-inter // BLOCK_N), E)](
        x, gu, b_gu if gpt else gu, act, order, counts, first, inter, K=hidden, TOPK=k,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GLU=True, GPT_OSS=gpt, HAS_BIAS=gpt,
        alpha=float(ms.swiglu_alpha), limit=float(ms.swiglu_limit),
        X_PER_PAIR=False, num_warps=4, num_stages=3)
    buf = torch.empty(B * k, hidden, dtype=torch.float32, device=x.device)
    kern[(-(-hidden // BLOCK_N), E)](
        act, down, mw.b_down if gpt else down, buf, order, counts, first, hidden, K=inter, TOPK=k,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GLU=False, GPT_OSS=gpt, HAS_BIAS=gpt,
        alpha=0.0, limit=0.0, X_PER_PAIR=True, num_warps=4, num_stages=3)
    buf = buf.view(B, k, hidden) * weights.view(B, k, 1)
    out = buf[:, 0]
    for j in range(1, k):                                                    # slot order, elementwise
        out = out + buf[:, j]
    return out.to(x.dtype)
