"""Decode attention on CUDA (Triton): rings read in place, long planes split across blocks.

Owns: `fused_decode_attention(qkv, ...)` -- one launch per layer that takes the
qkv projection of one token per batch row, applies qk-norm and RoPE, stores the
new K/V row into the row's plane, and attends over that plane (addressed
through a *plane table*); `decode_attention(q, ...)`, the same attention for an
already-prepared q and plane (no store); and `plane_row(plane)`, which fills
one row of a plane table.  Does not own: the plane bookkeeping (muser.cache;
the engine's graph runner fills `meta`).

Plane table (int64 [B, 4]) per layer and batch row:
    k_ptr, v_ptr          data pointers of the plane's K and V storage
    row_stride, head_stride   in elements (ring: token-major; growing: head-major)
Meta ([B, 2]):  slot the new row goes to, n = visible rows after the store.

Visible rows are physical slots [0, n): a growing plane holds positions
[0, n) at slots [0, n); a ring holds only rows its query may see (capacity
<= window), either filling from slot 0 or full -- the "ring decode" route of
muser.cache.staging, without its staging copy.  Rows are reduced in physical
order, which a restored ring reproduces (rotation rebuilt on install).

Flash-decoding, deterministic, one launch: grid (B * KV, NSPLIT).  Split s
covers rows [s * per, (s + 1) * per) with per = max(ceil(ceil(n / NSPLIT) /
BLOCK_N) * BLOCK_N, MIN_PER) -- a function of n alone -- and writes its (max,
sum, acc) partials.  Combining is two-level and in fixed order: the last split
of each group of GROUP_SPLITS to finish -- elected by a counter, which it resets
-- merges its group in split order; the last group to finish merges the groups
in group order.  Which program does a merge never changes its order, so the
result is bitwise reproducible.  No atomics touch values.
All query heads of a KV group share one pass over the rows (tl.dot, G padded
to 16).  The fused form computes q and the new row in every split (a few
hundred elements) and substitutes the new row from registers where its slot
falls, so no split reads a row another split of the same launch writes.
"""
from __future__ import annotations

import functools

import torch

from muser.env import Env

TAB_COLS = 4
RING_BLOCK_ROWS = 32          # a ring split covers ~this many rows (MUSER_RING_ROWS: experiments)
GROWING_SPLITS = 128          # splits of a growing plane (static grid: graph capture)
GROUP_SPLITS = 16             # first-level merge groups (two-level combine)
GROWING_MIN_ROWS = 32         # fewest rows per growing split (MUSER_GROWING_MIN_ROWS: experiments)


def plane_row(plane) -> list[int]:
    """[k_ptr, v_ptr, row_stride, head_stride] of a plane's storage (elements)."""
    k, v = plane.keys, plane.values
    row_dim, head_dim = (1, 0) if plane.head_major else (0, 1)
    if k.stride() != v.stride():
        raise ValueError(f"layer {plane.layer}: K and V storage strides differ")
    return [k.data_ptr(), v.data_ptr(), k.stride(row_dim), k.stride(head_dim)]


def _tile(tile: tuple[int, int] | None) -> dict:
    return {} if tile is None else {"block_n": tile[0], "warps": tile[1]}


def tune_for(growing: bool, env: Env = Env()) -> dict:
    """Launch settings for a plane kind: fewest rows per split (fewer active splits = less to
    combine at short lengths), and the tile (block_n, warps) when not the default
    (MUSER_GROWING_MIN_ROWS, MUSER_ATTN_GROWING, MUSER_ATTN_RING: experiments, see cuda_kernels.py)."""
    if growing:
        return {"min_rows": env.growing_min_rows, **_tile(env.attn_growing)}
    return _tile(env.attn_ring)


def splits_for(capacity: int, growing: bool, ring_rows: int = RING_BLOCK_ROWS) -> int:
    """Grid width for a plane of this capacity: static, so one graph serves every length
    (`ring_rows`: MUSER_RING_ROWS, experiments)."""
    if growing:
        return GROWING_SPLITS
    return max(1, min(64, -(-capacity // ring_rows)))


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def merge(MS, LS, ACC, first, stride, count, nvalid, gc, gcm, dm, cv,
              G: tl.constexpr, D: tl.constexpr, SB: tl.constexpr, BLOCK_GC: tl.constexpr,
              BLOCK_D: tl.constexpr):
        """Combine partials first + i * stride, i in [0, nvalid) (< count), in that order."""
        M = tl.full([BLOCK_GC], float("-inf"), tl.float32)
        L = tl.zeros([BLOCK_GC], tl.float32)
        A = tl.zeros([BLOCK_GC, BLOCK_D], tl.float32)
        for i0 in range(0, count, SB):
            ii = i0 + tl.arange(0, SB)
            msk = ((ii < count) & (ii < nvalid))[:, None] & gcm[None, :]            # [SB, GC]
            idx = (first + ii * stride)[:, None] * G + gc[None, :]
            mm = tl.load(MS + idx, mask=msk, other=float("-inf"), cache_modifier=".cg")
            ll = tl.load(LS + idx, mask=msk, other=0.0, cache_modifier=".cg")
            aa = tl.load(ACC + idx[:, :, None] * D + dm[None, None, :],
                         mask=msk[:, :, None] & cv[None, None, :], other=0.0, cache_modifier=".cg")
            M_new = tl.maximum(M, tl.max(mm, 0))
            w = tl.where(msk, tl.exp(mm - M_new[None, :]), 0.0)
            alpha = tl.exp(M - M_new)
            L = L * alpha + tl.sum(w * ll, 0)
            A = A * alpha[:, None] + tl.sum(w[:, :, None] * aa, 0)
            M = M_new
        return M, L, A

    @triton.jit
    def sink(SNK, heads, hm, M, L, A):
        """Join each head's sink logit to the merged softmax as one more key with no value:
        M' = max(M, sink), L' = L e^(M - M') + e^(sink - M'), A' = A e^(M - M')."""
        sk = tl.load(SNK + heads, mask=hm, other=float("-inf")).to(tl.float32)
        M_new = tl.maximum(M, sk)
        alpha = tl.exp(M - M_new)
        return M_new, L * alpha + tl.exp(sk - M_new), A * alpha[:, None]

    globals()["_merge"] = merge          # module globals: the interpreter resolves names there
    globals()["_sink"] = sink

    @triton.jit
    def attn_kernel(QKV, Q, POS, COS, SIN, QN, KN, TAB, META, MS, LS, ACC, CNT, O, SNK,
                    scale, softcap, eps,
                    H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_G: tl.constexpr,
                    BLOCK_GC: tl.constexpr, BLOCK_N: tl.constexpr, NSPLIT: tl.constexpr,
                    MIN_PER: tl.constexpr, GS: tl.constexpr, NG: tl.constexpr, NROWS: tl.constexpr,
                    SB: tl.constexpr, FUSED: tl.constexpr, QK_NORM: tl.constexpr,
                    ROPE: tl.constexpr, INTERLEAVED: tl.constexpr, SOFTCAP: tl.constexpr,
                    SINKS: tl.constexpr, V_NORM: tl.constexpr, K_EQ_V: tl.constexpr):
        pid = tl.program_id(0)                    # b * KV + kvh
        s = tl.program_id(1)                      # split
        b = pid // KV
        kvh = pid % KV
        # independent loads first (latency-bound): plane address, slot, length
        kp = tl.load(TAB + b * 4).to(tl.pointer_type(O.dtype.element_ty))
        vp = tl.load(TAB + b * 4 + 1).to(tl.pointer_type(O.dtype.element_ty))
        rs = tl.load(TAB + b * 4 + 2)
        hs = tl.load(TAB + b * 4 + 3)
        n = tl.load(META + b * 2 + 1)
        # Columns of the [*, 2 * BLOCK_H] tiles: the two rotation halves joined.  `dm` is the
        # memory dim of column c, `cv` whether it is a real dim (D need not be a power of 2).
        c = tl.arange(0, 2 * BLOCK_H)
        if INTERLEAVED:
            dm = c
            cv = c < D
        else:
            dm = tl.where(c < BLOCK_H, c, c - BLOCK_H + HALF)
            cv = (c % BLOCK_H) < HALF
        g = tl.arange(0, BLOCK_G)
        gm = g < G
        if FUSED:
            slot = tl.load(META + b * 2)
            j = tl.arange(0, BLOCK_H)
            jm = j < HALF
            if INTERLEAVED:
                i0 = 2 * j
                i1 = 2 * j + 1
            else:
                i0 = j
                i1 = j + HALF
            if K_EQ_V:                            # Gemma 4 global layers: q | k, V = raw K
                row = QKV + b * (H + KV) * D
                vsrc = row + (H + kvh) * D
            else:
                row = QKV + b * (H + 2 * KV) * D
                vsrc = row + (H + KV + kvh) * D
            qsrc = row + (kvh * G + g)[:, None] * D
            qm = gm[:, None] & jm[None, :]
            q0 = tl.load(qsrc + i0[None, :], mask=qm, other=0.0)
            q1 = tl.load(qsrc + i1[None, :], mask=qm, other=0.0)
            ksrc = row + (H + kvh) * D
            k0 = tl.load(ksrc + i0, mask=jm, other=0.0)
            k1 = tl.load(ksrc + i1, mask=jm, other=0.0)
            v_new = tl.load(vsrc + dm, mask=cv, other=0.0)
            dt = q0.dtype
            if V_NORM:                            # Gemma 4: RMS norm of v, no weight, rounded
                vf = v_new.to(tl.float32)
                v_new = (vf * tl.rsqrt(tl.sum(vf * vf, 0) / D + eps)).to(dt)
            q0 = q0.to(tl.float32)
            q1 = q1.to(tl.float32)
            k0 = k0.to(tl.float32)
            k1 = k1.to(tl.float32)
            if QK_NORM:                       # rounded to the activation dtype, as torch does
                wq0 = tl.load(QN + i0, mask=jm, other=0.0)
                wq1 = tl.load(QN + i1, mask=jm, other=0.0)
                wk0 = tl.load(KN + i0, mask=jm, other=0.0)
                wk1 = tl.load(KN + i1, mask=jm, other=0.0)
                rq = tl.rsqrt((tl.sum(q0 * q0, 1) + tl.sum(q1 * q1, 1)) / D + eps)
                q0 = (q0 * rq[:, None] * wq0[None, :]).to(dt).to(tl.float32)
                q1 = (q1 * rq[:, None] * wq1[None, :]).to(dt).to(tl.float32)
                rk = tl.rsqrt((tl.sum(k0 * k0, 0) + tl.sum(k1 * k1, 0)) / D + eps)
                k0 = (k0 * rk * wk0).to(dt).to(tl.float32)
                k1 = (k1 * rk * wk1).to(dt).to(tl.float32)
            if ROPE:
                pos = tl.load(POS + b)
                cs = tl.load(COS + pos * HALF + j, mask=jm, other=0.0)
                sn = tl.load(SIN + pos * HALF + j, mask=jm, other=0.0)
                q0, q1 = q0 * cs[None, :] - q1 * sn[None, :], q1 * cs[None, :] + q0 * sn[None, :]
                k0, k1 = k0 * cs - k1 * sn, k1 * cs + k0 * sn
            qj = tl.join(q0.to(dt), q1.to(dt))                  # [BLOCK_G, BLOCK_H, 2]
            kj = tl.join(k0.to(dt), k1.to(dt))                  # [BLOCK_H, 2]
            if INTERLEAVED:
                q = tl.reshape(qj, (BLOCK_G, 2 * BLOCK_H))
                k_new = tl.reshape(kj, (2 * BLOCK_H,))
            else:
                q = tl.reshape(tl.permute(qj, (0, 2, 1)), (BLOCK_G, 2 * BLOCK_H))
                k_new = tl.reshape(tl.permute(kj, (1, 0)), (2 * BLOCK_H,))
            # the new row goes into the plane once; no program of this launch reads it back
            # (each uses k_new / v_new from registers for that row)
            off = slot.to(tl.int64) * rs + kvh * hs
            smask = cv & ((c * 0 + s) == 0)             # a tensor mask (the interpreter)
            tl.store(kp + off + dm, k_new, mask=smask)
            tl.store(vp + off + dm, v_new, mask=smask)
        else:
            slot = -1
            q = tl.load(Q + (b * H + kvh * G + g)[:, None] * D + dm[None, :],
                        mask=gm[:, None] & cv[None, :], other=0.0)
        per = tl.maximum(tl.cdiv(tl.cdiv(n, NSPLIT), BLOCK_N) * BLOCK_N, MIN_PER)
        lo = s * per
        hi = tl.minimum(lo + per, n)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, 2 * BLOCK_H], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            rows = start + tl.arange(0, BLOCK_N)
            rmask = rows < hi
            offs = rows[:, None].to(tl.int64) * rs + kvh * hs + dm[None, :]
            lmask = (rmask & (rows != slot))[:, None] & cv[None, :]
            k = tl.load(kp + offs, mask=lmask, other=0.0)
            v = tl.load(vp + offs, mask=lmask, other=0.0)       # in flight with k (latency-bound)
            if FUSED:
                fresh = rows == slot
                k = tl.where(fresh[:, None], k_new[None, :], k)
                v = tl.where(fresh[:, None], v_new[None, :], v)
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
        base = pid * NSPLIT + s
        live = gm & ((g * 0 + lo) < hi)           # [BLOCK_G]: a tensor mask (the interpreter)
        tl.store(MS + base * G + g, m, mask=live)
        tl.store(LS + base * G + g, l, mask=live)
        tl.store(ACC + (base * G + g)[:, None] * D + dm[None, :], acc,
                 mask=live[:, None] & cv[None, :])
        # Combine, deterministically, in two levels: the last split of each group of GS to
        # finish merges the group (in split order) into the group's first slot; the last group
        # to finish merges the groups (in group order) into the output.  Which program does a
        # merge never changes its order.  Counters only elect (stores, barrier, one gpu-scope
        # acq_rel atomic: CUTLASS's split-K semaphore pattern) and are back at 0 at the end.
        nact = tl.cdiv(n, per)
        gc = tl.arange(0, BLOCK_GC)
        gcm = gc < G
        grp = s // GS
        g0 = grp * GS
        tl.debug_barrier()
        if NG == 1:
            ticket = tl.atomic_add(CNT + pid, 1, sem="acq_rel", scope="gpu")
        else:
            ticket = tl.atomic_add(CNT + NROWS + pid * NG + grp, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.minimum(GS, NSPLIT - g0) - 1:
            M, L, A = _merge(MS, LS, ACC, pid * NSPLIT + g0, 1, GS, tl.minimum(GS, nact - g0),
                            gc, gcm, dm, cv, G, D, SB, BLOCK_GC, 2 * BLOCK_H)
            if NG == 1:
                if SINKS:
                    M, L, A = _sink(SNK, kvh * G + gc, gcm, M, L, A)
                tl.store(O + (b * H + kvh * G + gc)[:, None] * D + dm[None, :],
                         (A / L[:, None]).to(O.dtype.element_ty), mask=gcm[:, None] & cv[None, :])
                tl.store(CNT + pid, 0)
            else:
                tl.store(CNT + NROWS + pid * NG + grp, 0)
                gl = gcm & ((gc * 0 + g0) < nact)      # [BLOCK_GC]: a tensor mask
                gb = pid * NSPLIT + g0
                tl.debug_barrier()
                tl.store(MS + gb * G + gc, M, mask=gl)
                tl.store(LS + gb * G + gc, L, mask=gl)
                tl.store(ACC + (gb * G + gc)[:, None] * D + dm[None, :], A,
                         mask=gl[:, None] & cv[None, :])
                tl.debug_barrier()
                top = tl.atomic_add(CNT + pid, 1, sem="acq_rel", scope="gpu")
                if top == NG - 1:
                    M2, L2, A2 = _merge(MS, LS, ACC, pid * NSPLIT, GS, NG, tl.cdiv(nact, GS),
                                       gc, gcm, dm, cv, G, D, SB, BLOCK_GC, 2 * BLOCK_H)
                    if SINKS:
                        M2, L2, A2 = _sink(SNK, kvh * G + gc, gcm, M2, L2, A2)
                    tl.store(O + (b * H + kvh * G + gc)[:, None] * D + dm[None, :],
                             (A2 / L2[:, None]).to(O.dtype.element_ty),
                             mask=gcm[:, None] & cv[None, :])
                    tl.store(CNT + pid, 0)

    return attn_kernel


def _pow2(x: int, lo: int = 1) -> int:
    p = lo
    while p < x:
        p *= 2
    return p


class DecodeWorkspace:
    """Split partials and election counters for one (batch size, geometry); reused by every
    layer of a step (launches on one stream run one after another; counters end at 0)."""

    def __init__(self, batch: int, kv_heads: int, group: int, head_dim: int, nsplit: int, device):
        f32 = dict(dtype=torch.float32, device=device)
        self.nsplit = nsplit
        self.ms = torch.empty(batch * kv_heads * nsplit * group, **f32)
        self.ls = torch.empty_like(self.ms)
        self.acc = torch.empty(batch * kv_heads * nsplit * group * head_dim, **f32)
        # per (row, kv head): one top counter, then one per group of GROUP_SPLITS splits
        self.cnt = torch.zeros(batch * kv_heads * (1 + -(-nsplit // GROUP_SPLITS)),
                               dtype=torch.int32, device=device)


def _launch(qkv, q, pos, cos, sin, q_norm, k_norm, eps, table, meta, heads, kv_heads, head_dim,
            nsplit, scale, softcap, interleaved, ws, out, min_rows=0, warps=None, sb=None,
            stages=2, block_n=None, sinks=None, v_norm=False, k_eq_v=False):
    kern = _kernel()
    B = table.shape[0]
    G = heads // kv_heads
    ng = -(-nsplit // GROUP_SPLITS)
    if ws is None or ws.nsplit < nsplit or ws.cnt.numel() < B * kv_heads * (1 + ng):
        ws = DecodeWorkspace(B, kv_heads, G, head_dim, nsplit, table.device)
    half = head_dim // 2
    block_h = _pow2(half, 8)
    # (32, 4) at D = 256 and (64, 4) below: the largest tiles that compile without spilling
    # (ptxas, sm_90; a [16, D] f32 accumulator and [block_n, D] K/V tiles in registers)
    # (the unfused form holds q in another layout: 16 rows at D = 256)
    block_n = block_n or ((32 if qkv is not None else 16) if 2 * block_h >= 256 else 64)
    min_per = -(-max(min_rows, block_n) // block_n) * block_n
    src = qkv if qkv is not None else q
    rope = cos is not None
    kern[(B * kv_heads, nsplit)](
        src, src, pos if pos is not None else meta, cos if rope else ws.ms, sin if rope else ws.ms,
        q_norm if q_norm is not None else ws.ms, k_norm if k_norm is not None else ws.ms,
        table, meta, ws.ms, ws.ls, ws.acc, ws.cnt, out, sinks if sinks is not None else ws.ms,
        float(scale), float(softcap or 1.0), float(eps),
        H=heads, KV=kv_heads, G=G, D=head_dim, HALF=half, BLOCK_H=block_h,
        BLOCK_G=_pow2(G, 16), BLOCK_GC=_pow2(G), BLOCK_N=block_n, NSPLIT=nsplit, MIN_PER=min_per,
        GS=GROUP_SPLITS, NG=ng, NROWS=B * kv_heads,
        SB=sb or max(2, 32 // _pow2(G)), FUSED=qkv is not None, QK_NORM=q_norm is not None,
        ROPE=rope, INTERLEAVED=bool(interleaved), SOFTCAP=softcap is not None,
        SINKS=sinks is not None, V_NORM=bool(v_norm), K_EQ_V=bool(k_eq_v),
        num_warps=warps or 4, num_stages=stages)
    return out


def fused_decode_attention(qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor | None,
                           sin: torch.Tensor | None, q_norm: torch.Tensor | None,
                           k_norm: torch.Tensor | None, eps: float, table: torch.Tensor,
                           meta: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                           nsplit: int, scale: float, softcap: float | None, interleaved: bool,
                           ws: DecodeWorkspace | None = None,
                           out: torch.Tensor | None = None, min_rows: int = 0,
                           sinks: torch.Tensor | None = None, v_norm: bool = False,
                           k_eq_v: bool = False, **tune) -> torch.Tensor:
    """qkv [B, (H + 2KV) * D] -> attention output [B, H, D], one launch.

    Per batch row: qk-norm (if given) and RoPE (if cos/sin) of q and k in float32, each
    rounded to the activation dtype as muser.model.transformer rounds; the k/v row stored at
    meta's slot of the row's plane; attention over the plane's n visible rows.  pos int64 [B].
    `sinks` float32 [H] (gpt-oss): each head's sink logit joins its softmax denominator.
    Gemma 4: `v_norm` (the new v row RMS-normed, no weight) and `k_eq_v` (qkv holds q | k only,
    and V is the raw K projection, before k-norm and RoPE).
    `min_rows` and `tune` (block_n / warps / sb / stages): `tune_for(growing)`.  Graph-capturable: no host reads, static grid.
    """
    B = qkv.shape[0]
    if out is None:
        out = qkv.new_empty(B, heads, head_dim)
    return _launch(qkv, None, pos, cos, sin, q_norm, k_norm, eps, table, meta, heads, kv_heads,
                   head_dim, nsplit, scale, softcap, interleaved, ws, out, min_rows,
                   sinks=sinks, v_norm=v_norm, k_eq_v=k_eq_v, **tune)


def decode_attention(q: torch.Tensor, table: torch.Tensor, meta: torch.Tensor, kv_heads: int,
                     nsplit: int, scale: float, softcap: float | None,
                     ws: DecodeWorkspace | None = None, out: torch.Tensor | None = None,
                     min_rows: int = 0, sinks: torch.Tensor | None = None,
                     **tune) -> torch.Tensor:
    """q [B, H, D] (cache dtype, already normed/rotated) over each row's plane -> [B, H, D].

    table int64 [B, 4] (see module doc), meta [B, 2] (only n is read); `nsplit` from
    `splits_for`.  Graph-capturable: no host reads, static grid.
    """
    B, H, D = q.shape
    if out is None:
        out = torch.empty_like(q)
    return _launch(None, q, None, None, None, None, None, 0.0, table, meta, H, kv_heads, D,
                   nsplit, scale, softcap, False, ws, out, min_rows, sinks=sinks, **tune)
