"""Mixture of experts for a decode step on CUDA (Triton): grouped by expert, no host sync.

Owns: `stack_experts` (a layer's expert matrices as one [E, out, in] tensor each; the
MoeWeights lists become views of it, so nothing is held twice), `route_rows` (the router,
top-k and the style's weights on the device) and `experts_rows` (each token's weighted sum
over its k experts).  Does not own: the maths they follow (`model/moe.py`, the eager
chunk path and the specification), the decode step that calls them (decode_step.py).

Grouping, without reading anything back to the host (the step is graph-captured):

    idx [B, k] -> pairs p = b * k + j -> `order` = pairs sorted by expert (stable),
    counts[e], first[e] = where e's pairs start in `order`     (one launch: group_kernel)

    grid (column tiles, E): program (n, e) walks e's pairs 16 at a time and
    exits at once when e has none (most programs at batch 1: k of E experts).

Each expert matrix is read once per 16 of its pairs, not once per pair.  Long prefill chunks
take the same kernels (grouped by torch's stable argsort, in 64 x 64 tiles): a token's expert
output has the same bits in a prefill chunk as in a decode step (tested on the GPU).  Row-invariant
like `triton_dot.dot_rows`: tiles of 16 rows on the tensor cores with K in fixed
BLOCK_K steps, so a pair's sums never see the other rows of its tile -- a session's
logits are bitwise the same decoded alone or beside others, however the others route.
Rounding is moe.py's: each product rounded to the activation dtype, gpt-oss's biases,
clamps and gate in float32, the activation rounded before the down product; every
(token, slot) result goes to its own float32 row; the k slots are summed in slot order.
Routing (softmax, top-k, the style's weights) is one launch, and so is the weighted sum: a
captured step pays a few microseconds per launch, and an eager routing is ~8 small ops.
"""
from __future__ import annotations

import functools

import torch

from .triton_pieces import _pow2

BLOCK_N = 32
BLOCK_K = 128
GROUP_MAX = 1024        # pairs grouped by group_kernel (one program, O(P^2) compares); above: torch


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
    if getattr(mw, "_stacked", None) is not None:     # stacked once: checked then
        return True
    mats = (mw.w_gate_up or []) + (mw.w_gate or []) + (mw.w_up or []) + list(mw.w_down)
    return all(isinstance(m, torch.Tensor) for m in mats)


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def experts_kernel(X, W, BIAS, OUT, ORDER, COUNTS, FIRST, N, K: tl.constexpr,
                       TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr,
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
            for r0 in range(0, cnt, BLOCK_M):
                rr = r0 + tl.arange(0, BLOCK_M)
                rmask = rr < cnt
                pair = tl.load(ORDER + start + rr, mask=rmask, other=0)
                row = pair if X_PER_PAIR else pair // TOPK
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                if GLU:
                    accu = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
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

    @triton.jit
    def route_kernel(LOGITS, SCALE, W_OUT, I_OUT, E: tl.constexpr, BLOCK_E: tl.constexpr,
                     TOPK: tl.constexpr, BLOCK_K: tl.constexpr, GPT_OSS: tl.constexpr,
                     HAS_SCALE: tl.constexpr):
        # one row's routing: moe.route's maths, top-k by repeated max (ties: the lower id)
        b = tl.program_id(0).to(tl.int64)
        e = tl.arange(0, BLOCK_E)
        em = e < E
        x = tl.load(LOGITS + b * E + e, mask=em, other=float("-inf")).to(tl.float32)
        if GPT_OSS:
            vals = x
        else:                                      # softmax over every expert first
            p = tl.exp(x - tl.max(x, 0))
            vals = tl.where(em, p / tl.sum(p, 0), float("-inf"))
        j = tl.arange(0, BLOCK_K)
        top = tl.full([BLOCK_K], float("-inf"), tl.float32)
        idx = tl.zeros([BLOCK_K], tl.int64)
        for r in tl.static_range(TOPK):
            m = tl.max(vals, 0)
            i = tl.min(tl.where(vals == m, e, BLOCK_E), 0)
            top = tl.where(j == r, m, top)
            idx = tl.where(j == r, i.to(tl.int64), idx)
            vals = tl.where(e == i, float("-inf"), vals)
        jm = j < TOPK
        if GPT_OSS:                                # softmax over the k largest logits
            q = tl.where(jm, tl.exp(top - tl.max(top, 0)), 0.0)
            w = q / tl.sum(q, 0)
        else:                                      # renormalized, then the per-expert scale
            t = tl.where(jm, top, 0.0)
            w = t / tl.sum(t, 0)
            if HAS_SCALE:
                w = w * tl.load(SCALE + idx, mask=jm, other=0.0).to(tl.float32)
        tl.store(W_OUT + b * TOPK + j, w, mask=jm)
        tl.store(I_OUT + b * TOPK + j, idx, mask=jm)

    @triton.jit
    def combine_kernel(BUF, W, OUT, N, TOPK: tl.constexpr, BLOCK: tl.constexpr):
        # out[b] = sum_j w[b, j] * buf[b * k + j], slots in order, float32, one rounding at the end
        b = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        cm = cols < N
        acc = tl.zeros([BLOCK], tl.float32)
        for j in tl.static_range(TOPK):
            w = tl.load(W + b * TOPK + j)
            acc = acc + w * tl.load(BUF + (b * TOPK + j) * N + cols, mask=cm, other=0.0)
        tl.store(OUT + b * N + cols, acc.to(OUT.dtype.element_ty), mask=cm)

    @triton.jit
    def group_kernel(IDX, ORDER, COUNTS, FIRST, P, E: tl.constexpr, BLOCK_E: tl.constexpr,
                     BLOCK_P: tl.constexpr):
        # One program: counts[e], first[e] (exclusive prefix sum) and `order`, the pairs sorted by
        # expert, stably -- pair i goes to first[e_i] + #{j < i : e_j == e_i}.
        e = tl.arange(0, BLOCK_E)
        em = e < E
        counts = tl.zeros([BLOCK_E], tl.int32)
        for p0 in range(0, P, BLOCK_P):
            pp = p0 + tl.arange(0, BLOCK_P)
            ex = tl.load(IDX + pp, mask=pp < P, other=-1)
            counts += tl.sum((ex[:, None] == e[None, :]).to(tl.int32), 0)
        first = tl.cumsum(counts, 0) - counts
        tl.store(COUNTS + e, counts, mask=em)
        tl.store(FIRST + e, first, mask=em)
        for p0 in range(0, P, BLOCK_P):
            pi = p0 + tl.arange(0, BLOCK_P)
            pim = pi < P
            ei = tl.load(IDX + pi, mask=pim, other=-1)
            before = tl.zeros([BLOCK_P], tl.int32)
            for q0 in range(0, p0 + BLOCK_P, BLOCK_P):
                qj = q0 + tl.arange(0, BLOCK_P)
                ej = tl.load(IDX + qj, mask=qj < P, other=-2)
                same = (ej[None, :] == ei[:, None]) & (qj[None, :] < pi[:, None])
                before += tl.sum(same.to(tl.int32), 1)
            base = tl.sum(tl.where(ei[:, None] == e[None, :], first[None, :], 0), 1)
            tl.store(ORDER + base + before, pi, mask=pim)

    return experts_kernel, route_kernel, combine_kernel, group_kernel


def route_rows(x: torch.Tensor, mw, ms, project) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, hidden] -> (weights float32 [B, k], expert ids int64 [B, k]) as `moe.route` does,
    with the router product through `project(x, w, bias)` (the step's row-invariant matmul) and
    the rest in one launch (`route_kernel`)."""
    logits = project(x, mw.router, mw.router_bias)                              # [B, E]
    B, E = logits.shape
    k = ms.top_k
    weights = torch.empty(B, k, dtype=torch.float32, device=x.device)
    idx = torch.empty(B, k, dtype=torch.int64, device=x.device)
    scale = mw.expert_scale
    _kernels()[1][(B,)](logits.contiguous(), scale if scale is not None else logits, weights, idx,
                        E=E, BLOCK_E=_pow2(E), TOPK=k, BLOCK_K=_pow2(k),
                        GPT_OSS=ms.style == "gpt_oss", HAS_SCALE=scale is not None, num_warps=1)
    return weights, idx


def experts_rows(x: torch.Tensor, mw, ms, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """sum_j weights[b, j] * expert_{idx[b, j]}(x[b]) -> [B, hidden] in x's dtype (moe.experts)."""
    kern, _, combine, group = _kernels()
    st = stack_experts(mw)
    gu, down = st["gu"], st["down"]
    B, k = idx.shape
    E, two_i, hidden = gu.shape
    inter = two_i // 2
    x = x.contiguous()
    P = B * k
    if P <= GROUP_MAX:                     # decode steps, short chunks: one launch, no host sync
        order = torch.empty(P, dtype=torch.int32, device=x.device)          # pairs by expert
        counts = torch.empty(E, dtype=torch.int32, device=x.device)
        first = torch.empty(E, dtype=torch.int32, device=x.device)
        group[(1,)](idx.contiguous(), order, counts, first, P, E=E, BLOCK_E=_pow2(E), BLOCK_P=64,
                    num_warps=4)
    else:                                  # long prefill chunks (group_kernel is O(P^2)): torch
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True).to(torch.int32)
        counts = torch.bincount(flat, minlength=E)
        first = (torch.cumsum(counts, 0) - counts).to(torch.int32)
        counts = counts.to(torch.int32)
    # decode steps / short chunks: 16 x 32 tiles; long chunks: 64 x 64 tiles; K in the same
    # BLOCK_K steps.  An element's sum is the same k-step sequence on the tensor cores whatever the
    # tile (measured on the H200: benchmarks/cuda_rowinv_probe.py; tested: chunk row == alone)
    bm, bn, nw = (16, BLOCK_N, 4) if P <= GROUP_MAX else (64, 64, 4)
    bk = BLOCK_K
    gpt = ms.style == "gpt_oss"
    b_gu = st["b_gu"]
    act = x.new_empty(B * k, inter)
    kern[(-(-inter // bn), E)](
        x, gu, b_gu if gpt else gu, act, order, counts, first, inter, K=hidden, TOPK=k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GLU=True, GPT_OSS=gpt, HAS_BIAS=gpt,
        alpha=float(ms.swiglu_alpha), limit=float(ms.swiglu_limit),
        X_PER_PAIR=False, num_warps=nw, num_stages=3)
    buf = torch.empty(B * k, hidden, dtype=torch.float32, device=x.device)
    kern[(-(-hidden // bn), E)](
        act, down, mw.b_down if gpt else down, buf, order, counts, first, hidden, K=inter, TOPK=k,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GLU=False, GPT_OSS=gpt, HAS_BIAS=gpt,
        alpha=0.0, limit=0.0, X_PER_PAIR=True, num_warps=nw, num_stages=3)
    out = x.new_empty(B, hidden)
    combine[(B, -(-hidden // 1024))](buf, weights.contiguous(), out, hidden, TOPK=k, BLOCK=1024,
                                     num_warps=4)
    return out
