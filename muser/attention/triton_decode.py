"""Decode attention on CUDA (Triton): rings read in place, long planes split across blocks.

Owns: `decode_attention(q, table, meta, ...)` -- one query token per batch row
attending over that row's plane, addressed through a *plane table*, and
`plane_row(plane)` which fills one row of that table.  Does not own: writing
the new row (muser.model.triton_ops stores it before this runs) or the plane
bookkeeping (muser.cache; the engine's graph runner fills `meta`).

Plane table (int64 [B, 4]) per layer and batch row:
    k_ptr, v_ptr          data pointers of the plane's K and V storage
    row_stride, head_stride   in elements (ring: token-major; growing: head-major)
Meta (int32 [B, 2]):  slot the new row went to, n = visible rows after the store.

Visible rows are physical slots [0, n): a growing plane holds positions
[0, n) at slots [0, n); a ring holds only rows its query may see (capacity
<= window), either filling from slot 0 or full -- the "ring decode" route of
muser.cache.staging, without its staging copy.  Rows are reduced in physical
order, which a restored ring reproduces (rotation rebuilt on install).

Flash-decoding, deterministic: grid (B * KV, NSPLIT).  Split s covers rows
[s * per, (s + 1) * per) with per = ceil(ceil(n / NSPLIT) / BLOCK_N) * BLOCK_N
-- a function of n alone -- and writes its (max, sum, acc) partials; a second
kernel combines the splits of each head in split order.  No atomics.  All
query heads of a KV group share one pass over the rows (tl.dot, G padded to 16).
"""
from __future__ import annotations

import functools

import torch

TAB_COLS = 4
RING_BLOCK_ROWS = 32          # a ring split covers about this many rows
GROWING_SPLITS = 128          # splits of a growing plane (static grid: graph capture)


def plane_row(plane) -> list[int]:
    """[k_ptr, v_ptr, row_stride, head_stride] of a plane's storage (elements)."""
    k, v = plane.keys, plane.values
    row_dim, head_dim = (1, 0) if plane.head_major else (0, 1)
    if k.stride() != v.stride():
        raise ValueError(f"layer {plane.layer}: K and V storage strides differ")
    return [k.data_ptr(), v.data_ptr(), k.stride(row_dim), k.stride(head_dim)]


def splits_for(capacity: int, growing: bool) -> int:
    """Grid width for a plane of this capacity: static, so one graph serves every length."""
    if growing:
        return GROWING_SPLITS
    return max(1, min(64, -(-capacity // RING_BLOCK_ROWS)))


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def split_kernel(Q, TAB, META, MS, LS, ACC, scale, softcap,
                     H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                     BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     NSPLIT: tl.constexpr, SOFTCAP: tl.constexpr):
        pid = tl.program_id(0)
        s = tl.program_id(1)
        b = pid // KV
        kvh = pid % KV
        n = tl.load(META + b * 2 + 1)
        per = tl.cdiv(tl.cdiv(n, NSPLIT), BLOCK_N) * BLOCK_N
        lo = s * per
        hi = tl.minimum(lo + per, n)
        kp = tl.load(TAB + b * 4).to(tl.pointer_type(Q.dtype.element_ty))
        vp = tl.load(TAB + b * 4 + 1).to(tl.pointer_type(Q.dtype.element_ty))
        rs = tl.load(TAB + b * 4 + 2)
        hs = tl.load(TAB + b * 4 + 3)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        gmask = g < G
        dmask = d < D
        q = tl.load(Q + (b * H + kvh * G + g)[:, None] * D + d[None, :],
                    mask=gmask[:, None] & dmask[None, :], other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            rows = start + tl.arange(0, BLOCK_N)
            rmask = rows < hi
            offs = rows[:, None].to(tl.int64) * rs + kvh * hs + d[None, :]
            lmask = rmask[:, None] & dmask[None, :]
            k = tl.load(kp + offs, mask=lmask, other=0.0)
            v = tl.load(vp + offs, mask=lmask, other=0.0)      # in flight with k (latency-bound)
            sc = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            if SOFTCAP:
                sc = (2.0 * tl.sigmoid(2.0 * sc / softcap) - 1.0) * softcap
            sc = tl.where(rmask[None, :], sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m = m_new
        base = (b * KV + kvh) * NSPLIT + s
        live = lo < hi
        tl.store(MS + base * G + g, m, mask=gmask & live)
        tl.store(LS + base * G + g, l, mask=gmask & live)
        tl.store(ACC + (base * G + g)[:, None] * D + d[None, :], acc,
                 mask=gmask[:, None] & dmask[None, :] & live)

    @triton.jit
    def combine_kernel(MS, LS, ACC, META, O,
                       H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NSPLIT: tl.constexpr,
                       SB: tl.constexpr):
        pid = tl.program_id(0)                 # b * H + h
        b = pid // H
        h = pid % H
        kvh = h // G
        g = h % G
        n = tl.load(META + b * 2 + 1)
        per = tl.cdiv(tl.cdiv(n, NSPLIT), BLOCK_N) * BLOCK_N
        nact = tl.cdiv(n, per)
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        M = tl.full([1], float("-inf"), tl.float32)
        L = tl.zeros([1], tl.float32)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, nact, SB):
            s = s0 + tl.arange(0, SB)
            smask = s < nact
            idx = ((b * KV + kvh) * NSPLIT + s) * G + g
            m = tl.load(MS + idx, mask=smask, other=float("-inf"))
            l = tl.load(LS + idx, mask=smask, other=0.0)
            a = tl.load(ACC + idx[:, None] * D + d[None, :], mask=smask[:, None] & dmask[None, :],
                        other=0.0)
            M_new = tl.maximum(M, tl.max(m, 0))
            w = tl.exp(m - M_new)                   # empty splits: exp(-inf) = 0
            alpha = tl.exp(M - M_new)
            L = L * alpha + tl.sum(w * l, 0)
            acc = acc * alpha + tl.sum(w[:, None] * a, 0)
            M = M_new
        out = acc / L
        tl.store(O + (b * H + h) * D + d, out.to(O.dtype.element_ty), mask=dmask)

    return split_kernel, combine_kernel


def _pow2(x: int, lo: int = 1) -> int:
    p = lo
    while p < x:
        p *= 2
    return p


class DecodeWorkspace:
    """Split partials for one (batch size, geometry); reused by every layer of a step."""

    def __init__(self, batch: int, kv_heads: int, group: int, head_dim: int, nsplit: int, device):
        f32 = dict(dtype=torch.float32, device=device)
        self.nsplit = nsplit
        self.ms = torch.empty(batch * kv_heads * nsplit * group, **f32)
        self.ls = torch.empty_like(self.ms)
        self.acc = torch.empty(batch * kv_heads * nsplit * group * head_dim, **f32)


def decode_attention(q: torch.Tensor, table: torch.Tensor, meta: torch.Tensor, kv_heads: int,
                     nsplit: int, scale: float, softcap: float | None,
                     ws: DecodeWorkspace | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, D] (cache dtype) over each row's plane -> [B, H, D].

    table int64 [B, 4] (see module doc), meta int32 [B, 2]; `nsplit` from
    `splits_for`.  Graph-capturable: no host reads, static grid.
    """
    split_kernel, combine_kernel = _kernels()
    B, H, D = q.shape
    G = H // kv_heads
    if ws is None or ws.nsplit < nsplit:
        ws = DecodeWorkspace(B, kv_heads, G, D, nsplit, q.device)
    if out is None:
        out = torch.empty_like(q)
    block_d = _pow2(D, 16)
    block_n = 32 if block_d >= 256 else 64
    split_kernel[(B * kv_heads, nsplit)](
        q, table, meta, ws.ms, ws.ls, ws.acc, float(scale), float(softcap or 1.0),
        H=H, KV=kv_heads, G=G, D=D, BLOCK_G=_pow2(G, 16), BLOCK_N=block_n, BLOCK_D=block_d,
        NSPLIT=nsplit, SOFTCAP=softcap is not None, num_warps=4, num_stages=2)
    combine_kernel[(B * H,)](
        ws.ms, ws.ls, ws.acc, meta, out, H=H, KV=kv_heads, G=G, D=D, BLOCK_N=block_n,
        BLOCK_D=block_d, NSPLIT=nsplit, SB=16, num_warps=4)
    return out
