"""Decode attention on CUDA (Triton): planes read in place, by position, split across blocks.

Owns: `fused_decode_attention(qkv, ...)` -- one launch per layer that takes the
qkv projection of one token per batch row, applies qk-norm and RoPE, stores the
new K/V row into the row's plane (addressed through a *plane table*) and
attends over that plane; `decode_attention(q, ...)`, the same attention for an
already-prepared q (no store); `prepare_rows(qkv, ...)`, the same launch's
first half for the rows of a chunk (q, k, v out, no attention: the chunk path
attends with triton_chunk.py); and `plane_row(plane)`.  Does not own: the
plane bookkeeping (muser.cache; the graph runner fills `meta`), the reduction
shape and its pieces (triton_attn.py).

Plane table (int64 [B, 4]) per layer and batch row:
    k_ptr, v_ptr          data pointers of the plane's K and V storage
    row_stride, head_stride   in elements (ring: token-major; growing: head-major)
Meta ([B, 2]):  slot the new row goes to, n = visible rows after the store.
Positions ([B]): the new row's position p.  The row sees positions [p - n + 1, p]; position
x lives at slot (slot + x - p), modulo the capacity on a ring -- so a ring is read in place,
rotation and all, in POSITION order.

Grid (B * KV, NSPLIT): program s takes split a0 + s of triton_attn's absolute splits (a0 =
the row's first), writes its (max, sum, acc) partial, and takes a ticket for its merge group.
The last of a group to arrive folds the group's partials in split order; when a row spans
several groups, the last group to arrive folds the groups in order.  Which program merges
never changes what is folded or in which order, so the result is bitwise reproducible --
and equal to a chunk row's (triton_chunk.py), which folds the same splits in the same order.
Counters only elect (stores, barrier, one gpu-scope acq_rel atomic: CUTLASS's split-K
semaphore pattern) and are back at 0 at the end.  All query heads of a KV group share one
pass over the keys (tl.dot, G padded to 16).  The fused form computes q and the new row in
every split (a few hundred elements), stores both (every split the same bits), and reads them
back like any other row: its attention is then the q-given form's, and a chunk's.
"""
from __future__ import annotations

import functools

import torch

from .triton_attn import layout, pieces, _pow2

TAB_COLS = 4


def plane_row(plane) -> list[int]:
    """[k_ptr, v_ptr, row_stride, head_stride] of a plane's storage (elements)."""
    k, v = plane.keys, plane.values
    row_dim, head_dim = (1, 0) if plane.head_major else (0, 1)
    if k.stride() != v.stride():
        raise ValueError(f"layer {plane.layer}: K and V storage strides differ")
    return [k.data_ptr(), v.data_ptr(), k.stride(row_dim), k.stride(head_dim)]


def splits_for(capacity: int, growing: bool, split: int) -> int:
    """Grid width for a plane: enough programs for the most splits a row can span (static, so
    one graph serves every length).  A ring row spans `capacity` positions from anywhere:
    one split more than capacity / split when it starts mid-split."""
    return -(-capacity // split) + (0 if growing else 1)


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    globals().update(pieces())          # module globals: the interpreter resolves names there

    @triton.jit
    def load_parked(MS, LS, ACC, prow, i, count, lo, a0, gc, gcm, dm, cv, G: tl.constexpr,
                    D: tl.constexpr, GS: tl.constexpr, TOP: tl.constexpr):
        """The i-th parked partial of a merge (an empty one past `count`): group level, slots
        lo, lo + 1, ..; top level (TOP), each group's first slot."""
        if TOP:
            idx = tl.maximum((a0 // GS + i) * GS, a0) - a0
        else:
            idx = lo + i
        msk = gcm & ((gc * 0 + i) < count)
        pb = (prow + idx) * G + gc
        mm = tl.load(MS + pb, mask=msk, other=float("-inf"), cache_modifier=".cg")
        ll = tl.load(LS + pb, mask=msk, other=0.0, cache_modifier=".cg")
        aa = tl.load(ACC + pb[:, None] * D + dm[None, :], mask=msk[:, None] & cv[None, :], other=0.0,
                     cache_modifier=".cg")
        return mm, ll, aa

    @triton.jit
    def fold(MS, LS, ACC, prow, lo, count, a0, gc, gcm, dm, cv, G: tl.constexpr, D: tl.constexpr,
             GS: tl.constexpr, TOP: tl.constexpr, DEPTH: tl.constexpr, BLOCK_GC: tl.constexpr,
             DP: tl.constexpr):
        """Fold `count` parked partials into an empty total, one by one in order (merge_one:
        the chunk's order and arithmetic).  DEPTH 4 issues four partials' loads before folding
        them (the fold is load-latency-bound: a ring row's 17 splits are 17 rounds at DEPTH 1);
        a partial past `count` is empty and folds as an exact no-op, so the bits are DEPTH's
        to choose freely."""
        M = tl.full([BLOCK_GC], float("-inf"), tl.float32)
        L = tl.zeros([BLOCK_GC], tl.float32)
        A = tl.zeros([BLOCK_GC, DP], tl.float32)
        for i0 in range(0, count, DEPTH):
            if DEPTH == 4:
                m0, l0, x0 = _load_parked(MS, LS, ACC, prow, i0, count, lo, a0, gc, gcm,
                                              dm, cv, G, D, GS, TOP)
                m1, l1, x1 = _load_parked(MS, LS, ACC, prow, i0 + 1, count, lo, a0, gc, gcm,
                                              dm, cv, G, D, GS, TOP)
                m2, l2, x2 = _load_parked(MS, LS, ACC, prow, i0 + 2, count, lo, a0, gc, gcm,
                                              dm, cv, G, D, GS, TOP)
                m3, l3, x3 = _load_parked(MS, LS, ACC, prow, i0 + 3, count, lo, a0, gc, gcm,
                                              dm, cv, G, D, GS, TOP)
                M, L, A = _merge_one(M, L, A, m0, l0, x0)
                M, L, A = _merge_one(M, L, A, m1, l1, x1)
                M, L, A = _merge_one(M, L, A, m2, l2, x2)
                M, L, A = _merge_one(M, L, A, m3, l3, x3)
            else:
                m0, l0, x0 = _load_parked(MS, LS, ACC, prow, i0, count, lo, a0, gc, gcm,
                                              dm, cv, G, D, GS, TOP)
                M, L, A = _merge_one(M, L, A, m0, l0, x0)
        return M, L, A

    globals()["_load_parked"] = load_parked
    globals()["_fold"] = fold

    # runtime ints that differ between a decode launch and prepare_rows stay runtime values
    # (Triton would otherwise specialise a 1): one binary, one prologue arithmetic
    @triton.jit(do_not_specialize=["capm", "NGG", "NROWS"])
    def attn_kernel(QKV, Q, POS, COS, SIN, QN, KN, TAB, META, MS, LS, ACC, CNT, O, SNK, QOUT,
                    scale, softcap, eps, capm, NGG, NROWS,
                    H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_G: tl.constexpr,
                    BLOCK_GC: tl.constexpr, BLOCK_N: tl.constexpr, NSPLIT: tl.constexpr,
                    SPLIT: tl.constexpr, GS: tl.constexpr, DEPTH: tl.constexpr,
                    FUSED: tl.constexpr, QK_NORM: tl.constexpr, ROPE: tl.constexpr,
                    INTERLEAVED: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
                    V_NORM: tl.constexpr, K_EQ_V: tl.constexpr, RING: tl.constexpr):
        pid = tl.program_id(0)                    # b * KV + kvh
        s = tl.program_id(1)                      # split, counted from the row's first
        b = pid // KV
        kvh = pid % KV
        # independent loads first (latency-bound): plane address, slot, length, position
        kp = tl.load(TAB + b * 4).to(tl.pointer_type(O.dtype.element_ty))
        vp = tl.load(TAB + b * 4 + 1).to(tl.pointer_type(O.dtype.element_ty))
        rs = tl.load(TAB + b * 4 + 2)
        hs = tl.load(TAB + b * 4 + 3)
        slot = tl.load(META + b * 2)
        n = tl.load(META + b * 2 + 1)
        pos = tl.load(POS + b)
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
            # Every split stores the new row (the same bits to the same slot) and q (to QOUT),
            # then reads both back like any other row: the attention below is the q-given
            # form's, instruction for instruction -- and so a chunk's (triton_chunk.py).  (With
            # q and the new row taken from registers instead, 10 of 150 rows came out one bf16
            # step from the q-given form on the H200: the compiled dots differ.)  A split reads
            # the slot after its own store and a CTA barrier, so it sees its own bits or the
            # same bits another split stored; nobody reads the row the slot held before (on a
            # ring, position p - capacity: not visible).
            off = slot.to(tl.int64) * rs + kvh * hs
            tl.store(kp + off + dm, k_new, mask=cv)
            tl.store(vp + off + dm, v_new, mask=cv)
            qp = QOUT + (b * H + kvh * G + g)[:, None] * D + dm[None, :]
            tl.store(qp, q, mask=gm[:, None] & cv[None, :])
            tl.debug_barrier()
            q = tl.load(qp, mask=gm[:, None] & cv[None, :], other=0.0)
        else:
            q = tl.load(Q + (b * H + kvh * G + g)[:, None] * D + dm[None, :],
                        mask=gm[:, None] & cv[None, :], other=0.0)
        lo_pos = pos - n + 1                      # n = 0 (prepare_rows): no split is live
        a0 = lo_pos // SPLIT
        a_last = pos // SPLIT
        nact = tl.where(n > 0, a_last - a0 + 1, 0)
        if s < nact:
            a = a0 + s
            t_lo = tl.maximum(a * SPLIT, (lo_pos // BLOCK_N) * BLOCK_N)
            t_hi = tl.minimum(a * SPLIT + SPLIT, pos + 1)
            lo_v = tl.zeros([BLOCK_G], tl.int64) + lo_pos
            hi_v = tl.zeros([BLOCK_G], tl.int64) + pos + 1
            ones = tl.full([BLOCK_N, 16], 1.0, O.dtype.element_ty)
            m = tl.full([BLOCK_G], float("-inf"), tl.float32)
            l = tl.zeros([BLOCK_G], tl.float32)
            acc = tl.zeros([BLOCK_G, 2 * BLOCK_H], tl.float32)
            for start in range(t_lo, t_hi, BLOCK_N):
                kpos = start + tl.arange(0, BLOCK_N)
                phys = slot + (kpos - pos)
                if RING:
                    phys = (phys + capm) % capm
                lm = (kpos >= lo_pos) & (kpos <= pos)
                offs = phys[:, None].to(tl.int64) * rs + kvh * hs + dm[None, :]
                k = tl.load(kp + offs, mask=lm[:, None] & cv[None, :], other=0.0)
                v = tl.load(vp + offs, mask=lm[:, None] & cv[None, :], other=0.0)
                m, l, acc = _tile_step(q, k, v, kpos, lo_v, hi_v, m, l, acc, ones, scale,
                                       softcap, SOFTCAP)
            base = pid * NSPLIT + s
            tl.store(MS + base * G + g, m, mask=gm)
            tl.store(LS + base * G + g, l, mask=gm)
            tl.store(ACC + (base * G + g)[:, None] * D + dm[None, :], acc,
                     mask=gm[:, None] & cv[None, :])
            # tickets: the group of absolute split a, counted from the row's first group
            gc = tl.arange(0, BLOCK_GC)
            gcm = gc < G
            grp = a // GS
            g_first = tl.maximum(grp * GS, a0)
            g_last = tl.minimum(grp * GS + GS - 1, a_last)
            ngrp = a_last // GS - a0 // GS + 1
            gcnt = CNT + NROWS + pid * NGG + (grp - a0 // GS)
            tl.debug_barrier()
            ticket = tl.atomic_add(gcnt, 1, sem="acq_rel", scope="gpu")
            if ticket == g_last - g_first:
                tl.store(gcnt, 0)
                M, L, A = _fold(MS, LS, ACC, pid * NSPLIT, g_first - a0, g_last - g_first + 1, a0,
                                gc, gcm, dm, cv, G, D, GS, False, DEPTH, BLOCK_GC, 2 * BLOCK_H)
                if ngrp > 1:                      # park the group's total in its first slot
                    gb = (pid * NSPLIT + g_first - a0) * G + gc
                    tl.store(MS + gb, M, mask=gcm)
                    tl.store(LS + gb, L, mask=gcm)
                    tl.store(ACC + gb[:, None] * D + dm[None, :], A, mask=gcm[:, None] & cv[None, :])
                    tl.debug_barrier()
                    top = tl.atomic_add(CNT + pid, 1, sem="acq_rel", scope="gpu")
                    if top == ngrp - 1:
                        tl.store(CNT + pid, 0)
                        # (a chunk folds one group's total into an empty total too: exact)
                        M, L, A = _fold(MS, LS, ACC, pid * NSPLIT, 0, ngrp, a0, gc, gcm, dm, cv,
                                        G, D, GS, True, DEPTH, BLOCK_GC, 2 * BLOCK_H)
                        if SINKS:
                            M, L, A = _sink(SNK, kvh * G + gc, gcm, M, L, A)
                        tl.store(O + (b * H + kvh * G + gc)[:, None] * D + dm[None, :],
                                 (A / L[:, None]).to(O.dtype.element_ty),
                                 mask=gcm[:, None] & cv[None, :])
                else:
                    if SINKS:
                        M, L, A = _sink(SNK, kvh * G + gc, gcm, M, L, A)
                    tl.store(O + (b * H + kvh * G + gc)[:, None] * D + dm[None, :],
                             (A / L[:, None]).to(O.dtype.element_ty), mask=gcm[:, None] & cv[None, :])

    return attn_kernel


class DecodeWorkspace:
    """Split partials and election counters for one (batch size, geometry); reused by every
    layer of a step (launches on one stream run one after another; counters end at 0)."""

    def __init__(self, batch: int, kv_heads: int, group: int, head_dim: int, nsplit: int, device,
                 ngroups: int | None = None):
        f32 = dict(dtype=torch.float32, device=device)
        self.nsplit = nsplit
        self.ngroups = ngroups if ngroups is not None else nsplit
        self.ms = torch.empty(batch * kv_heads * nsplit * group, **f32)
        self.ls = torch.empty_like(self.ms)
        self.acc = torch.empty(batch * kv_heads * nsplit * group * head_dim, **f32)
        # per (row, kv head): one top counter, then one per merge group the grid can touch
        self.cnt = torch.zeros(batch * kv_heads * (1 + self.ngroups), dtype=torch.int32, device=device)
        self.q = None                 # [B, H, D] the fused form's q (allocated on first use)

    def q_for(self, batch: int, heads: int, head_dim: int, dtype) -> torch.Tensor:
        """The fused form's q scratch: one buffer for every layer (the first call sizes it;
        a graph's warm-up makes that call before capture)."""
        n = batch * heads * head_dim
        if self.q is None or self.q.numel() < n or self.q.dtype != dtype:
            self.q = torch.empty(n, dtype=dtype, device=self.cnt.device)
        return self.q


def merge_groups(nsplit: int, group: int) -> int:
    """Merge groups a grid of `nsplit` splits can touch (its first split need not start one)."""
    return min(nsplit, -(-nsplit // group) + 1)


def _launch(qkv, q, pos, cos, sin, q_norm, k_norm, eps, table, meta, heads, kv_heads, head_dim,
            nsplit, scale, softcap, interleaved, ws, out, split, group, block_n, warps,
            depth=1, chunk_loop=None, capacity=0, sinks=None, v_norm=False, k_eq_v=False, qout=None, grid_splits=None):
    kern = _kernel()                     # (chunk_loop: the chunk kernel's layout key, not this one's)
    B = table.shape[0]
    G = heads // kv_heads
    ngg = merge_groups(nsplit, group)
    if qout is not None and grid_splits == 1:      # prepare_rows: nothing attends or merges
        ws = DecodeWorkspace(1, 1, 1, 1, 1, table.device, ngg)
    elif (ws is None or ws.nsplit < nsplit or ws.ngroups < ngg
            or ws.cnt.numel() < B * kv_heads * (1 + ws.ngroups) or ws.ms.numel() < B * kv_heads * nsplit * G):
        ws = DecodeWorkspace(B, kv_heads, G, head_dim, nsplit, table.device, ngg)
    half = head_dim // 2
    block_h = _pow2(half, 8)
    src = qkv if qkv is not None else q
    rope = cos is not None
    dummy = ws.ms
    kern[(B * kv_heads, grid_splits or nsplit)](
        src, src, pos, cos if rope else dummy, sin if rope else dummy,
        q_norm if q_norm is not None else dummy, k_norm if k_norm is not None else dummy,
        table, meta, ws.ms, ws.ls, ws.acc, ws.cnt, out, sinks if sinks is not None else dummy,
        qout if qout is not None else ws.q_for(B, heads, head_dim, src.dtype),
        float(scale), float(softcap or 1.0), float(eps), int(capacity), ws.ngroups, B * kv_heads,
        H=heads, KV=kv_heads, G=G, D=head_dim, HALF=half, BLOCK_H=block_h,
        BLOCK_G=_pow2(G, 16), BLOCK_GC=_pow2(G), BLOCK_N=block_n, NSPLIT=nsplit, SPLIT=split,
        GS=group, DEPTH=depth, FUSED=qkv is not None,
        QK_NORM=q_norm is not None, ROPE=rope, INTERLEAVED=bool(interleaved),
        SOFTCAP=softcap is not None, SINKS=sinks is not None, V_NORM=bool(v_norm),
        K_EQ_V=bool(k_eq_v), RING=capacity > 0, num_warps=warps, enable_fp_fusion=False)
    return out


def fused_decode_attention(qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor | None,
                           sin: torch.Tensor | None, q_norm: torch.Tensor | None,
                           k_norm: torch.Tensor | None, eps: float, table: torch.Tensor,
                           meta: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                           nsplit: int, scale: float, softcap: float | None, interleaved: bool,
                           ws: DecodeWorkspace | None = None, out: torch.Tensor | None = None,
                           sinks: torch.Tensor | None = None, v_norm: bool = False,
                           k_eq_v: bool = False, capacity: int = 0, **lay) -> torch.Tensor:
    """qkv [B, (H + 2KV) * D] -> attention output [B, H, D], one launch.

    Per batch row: qk-norm (if given) and RoPE (if cos/sin) of q and k in float32, each
    rounded to the activation dtype as muser.model.transformer rounds; the k/v row stored at
    meta's slot of the row's plane; attention over the row's n visible positions.  pos int64
    [B].  `capacity`: the ring's (0: a growing plane).  `lay`: triton_attn.layout's split /
    group / block_n / warps (defaults: a growing plane's).
    `sinks` float32 [H] (gpt-oss): each head's sink logit joins its softmax denominator.
    Gemma 4: `v_norm` (the new v row RMS-normed, no weight) and `k_eq_v` (qkv holds q | k only,
    and V is the raw K projection, before k-norm and RoPE).
    Graph-capturable: no host reads, static grid.
    """
    B = qkv.shape[0]
    if out is None:
        out = qkv.new_empty(B, heads, head_dim)
    lay = {**layout(capacity == 0, head_dim), **lay}
    return _launch(qkv, None, pos, cos, sin, q_norm, k_norm, eps, table, meta, heads, kv_heads,
                   head_dim, nsplit, scale, softcap, interleaved, ws, out, capacity=capacity,
                   sinks=sinks, v_norm=v_norm, k_eq_v=k_eq_v, **lay)


def prepare_rows(qkv: torch.Tensor, pos: torch.Tensor, cos, sin, q_norm, k_norm, eps: float,
                 heads: int, kv_heads: int, head_dim: int, nsplit: int, interleaved: bool,
                 v_norm: bool = False, k_eq_v: bool = False, capacity: int = 0,
                 **lay) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chunk's rows through the decode launch's first half: (q [R, H, D], k [R, KV, D],
    v [R, KV, D]) with qk-norm, RoPE and v-norm applied exactly as `fused_decode_attention`
    applies them -- it IS that launch (same kernel, same constants), told to write q out, to
    store each row's k/v into a buffer (its "plane"), and to attend over nothing."""
    R = qkv.shape[0]
    k = qkv.new_empty(R, kv_heads, head_dim)
    v = torch.empty_like(k)
    q = qkv.new_empty(R, heads, head_dim)
    table = torch.tensor([[k.data_ptr(), v.data_ptr(), kv_heads * head_dim, head_dim]],
                         dtype=torch.int64, device=qkv.device).expand(R, 4).contiguous()
    meta = torch.stack([torch.arange(R, device=qkv.device), torch.zeros(R, dtype=torch.long,
                                                                        device=qkv.device)], 1)
    lay = {**layout(capacity == 0, head_dim), **lay}
    _launch(qkv, None, pos, cos, sin, q_norm, k_norm, eps, table, meta.contiguous(), heads,
            kv_heads, head_dim, nsplit, 1.0, None, interleaved, None, q, capacity=capacity,
            v_norm=v_norm, k_eq_v=k_eq_v, qout=q, grid_splits=1, **lay)
    return q, k, v


def decode_attention(q: torch.Tensor, pos: torch.Tensor, table: torch.Tensor, meta: torch.Tensor,
                     kv_heads: int, nsplit: int, scale: float, softcap: float | None,
                     ws: DecodeWorkspace | None = None, out: torch.Tensor | None = None,
                     sinks: torch.Tensor | None = None, capacity: int = 0, **lay) -> torch.Tensor:
    """q [B, H, D] (cache dtype, already normed/rotated) at positions pos [B] over each row's
    plane -> [B, H, D].  table int64 [B, 4], meta [B, 2] (see module doc); `nsplit` from
    `splits_for`.  Graph-capturable: no host reads, static grid."""
    B, H, D = q.shape
    if out is None:
        out = torch.empty_like(q)
    lay = {**layout(capacity == 0, D), **lay}
    return _launch(None, q, pos, None, None, None, None, 0.0, table, meta, H, kv_heads, D,
                   nsplit, scale, softcap, False, ws, out, capacity=capacity, sinks=sinks, **lay)
