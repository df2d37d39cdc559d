"""The decode attention kernel's source (Triton): what triton_decode.py launches.

Owns: `_kernel()`, the one-launch decode attention (built lazily: this module imports without
Triton), and its tile read (`load_kv`, `decode_tile`).  Does not own: launching it, plane
tables, workspaces (triton_decode.py, whose docstring describes the grid, the elections and the
positional reading), the merge of parked partials (triton_decode_merge.py), the reduction's
shared pieces (triton_attn.py).
"""
from __future__ import annotations

import functools

from .triton_attn import pieces
from .triton_decode_merge import merge_pieces
from .triton_pieces import pdl_pieces, rope_pieces


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    globals().update(pieces())          # module globals: the interpreter resolves names there
    globals().update(pdl_pieces())
    globals().update(rope_pieces())
    globals().update(merge_pieces())

    @triton.jit
    def load_kv(kp, vp, kpos, lo, hi, slot, pos, capm, rs, hs, kvh, dm, cv, RING: tl.constexpr):
        """The K and V rows of positions kpos in [lo, hi] (zeros elsewhere), read in place by
        position: slot holds pos, a ring wraps at capm.  A ring's visible positions lie within
        one capacity before the slot (n <= capm), so one conditional add wraps them:

            kpos in [pos - n + 1, pos]  ->  phys = slot + kpos - pos in [slot - capm + 1, slot]

        (`(phys + capm) % capm` said the same with an int64 remainder: 24 inline divisions a
        warp, ~a quarter of a ring launch's instructions on the H200; positions outside the
        row are masked, their addresses never read)."""
        phys = slot + (kpos - pos)
        if RING:
            phys = tl.where(phys < 0, phys + capm, phys)
        lm = (kpos >= lo) & (kpos <= hi)
        offs = phys[:, None].to(tl.int64) * rs + kvh * hs + dm[None, :]
        k = tl.load(kp + offs, mask=lm[:, None] & cv[None, :], other=0.0)
        v = tl.load(vp + offs, mask=lm[:, None] & cv[None, :], other=0.0)
        return k, v

    globals()["_load_kv"] = load_kv

    @triton.jit
    def decode_tile(kp, vp, start, slot, pos, lo_pos, capm, rs, hs, kvh, dm, cv, q, lo_v, hi_v,
                    m, l, acc, ones, scale, softcap, BLOCK_N: tl.constexpr,
                    SOFTCAP: tl.constexpr, RING: tl.constexpr, MASKED: tl.constexpr,
                    ACC_DOT: tl.constexpr):
        """The keys of positions start.. read in place by position (slot holds pos; a ring
        wraps at capm), folded into the row's running softmax."""
        kpos = start + tl.arange(0, BLOCK_N)
        k, v = _load_kv(kp, vp, kpos, lo_pos, pos, slot, pos, capm, rs, hs, kvh, dm, cv, RING)
        return _tile_step(q, k, v, kpos, lo_v, hi_v, m, l, acc, ones, scale, softcap, SOFTCAP,
                          MASKED, ACC_DOT)

    globals()["_decode_tile"] = decode_tile

    @triton.jit
    def row_out(O, SNK, b, kvh, gc, gcm, dm, cv, M, L, A, H: tl.constexpr, G: tl.constexpr,
                D: tl.constexpr, SINKS: tl.constexpr):
        """A row's merged (M, L, A) -> its attention output (after the sinks' mass), stored."""
        if SINKS:
            M, L, A = _sink(SNK, kvh * G + gc, gcm, M, L, A)
        tl.store(O + (b * H + kvh * G + gc)[:, None] * D + dm[None, :],
                 (A / L[:, None]).to(O.dtype.element_ty), mask=gcm[:, None] & cv[None, :])

    globals()["_row_out"] = row_out

    # runtime ints that differ between a decode launch and prepare_rows stay runtime values
    # (Triton would otherwise specialise a 1): one binary, one prologue arithmetic
    @triton.jit(do_not_specialize=["capm", "NGG", "NROWS", "PF0", "PN0", "PF1", "PN1", "PF2",
                                   "PN2", "PCH"])
    def attn_kernel(QKV, Q, POS, COS, SIN, QN, KN, TAB, META, MS, LS, ACC, CNT, O, SNK, QOUT,
                    scale, softcap, eps, capm, NGG, NROWS, PF0, PN0, PF1, PN1, PF2, PN2, PCH,
                    H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_G: tl.constexpr,
                    BLOCK_GC: tl.constexpr, BLOCK_N: tl.constexpr, NSPLIT: tl.constexpr,
                    SPLIT: tl.constexpr, GS: tl.constexpr, DEPTH: tl.constexpr,
                    FUSED: tl.constexpr, QK_NORM: tl.constexpr, ROPE: tl.constexpr,
                    INTERLEAVED: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
                    V_NORM: tl.constexpr, K_EQ_V: tl.constexpr, RING: tl.constexpr,
                    ACC_DOT: tl.constexpr, PDL: tl.constexpr, PREP: tl.constexpr = False,
                    NPF: tl.constexpr = 0, PF_LANES: tl.constexpr = 128,
                    EARLY: tl.constexpr = False):
        pid = tl.program_id(0)                    # b * KV + kvh (NPF: row NROWS prefetches)
        s = tl.program_id(1)                      # split, counted from the row's first
        # NPF (l2_prefetch.py): one more grid row whose first NPF programs bring the next
        # projections' weights into the L2, after the PDL wait
        pf = (pid == NROWS) & (s < NPF)
        if not EARLY:
            _pdl_prefetch_begin(pf, s, PF0, PN0, PF1, PN1, PF2, PN2, PCH, PDL, NPF, PF_LANES)
        rid = pid
        if NPF > 0:
            rid = tl.minimum(pid, NROWS - 1)      # the prefetch row reads a real row's table
        b = rid // KV
        kvh = rid % KV
        # independent loads first (latency-bound): plane address, slot, length, position
        kp, vp, rs, hs = _plane_at(TAB + b * 4, O.dtype.element_ty, D)
        slot = tl.load(META + b * 2)
        n = tl.load(META + b * 2 + 1)
        pos = tl.load(POS + b)
        lo_pos = pos - n + 1                      # n = 0 (prepare_rows): no split is live
        a0 = lo_pos // SPLIT
        a_last = pos // SPLIT
        nact = tl.where(n > 0, a_last - a0 + 1, 0)
        # The grid is as wide as the most splits a row can span (a growing plane: its capacity
        # over SPLIT, ~264 at 32k); a split past the row's last would only repeat the live
        # splits' prologue and stores.  It leaves at once; split 0 always works (prepare_rows:
        # no split is live, split 0 stores the rows).  The live splits run the same
        # instructions as before: the same bits.
        live = (s < nact) | (s == 0)
        if NPF > 0:
            live = live & (pid < NROWS)           # the prefetch row attends nothing
        if EARLY:
            # MUSER_ATTN_EARLY (PDL only): nothing above and nothing loaded here is written by
            # the kernel before (the step's upload, tables, constants), so it is read before the
            # wait, and a split past the row's last leaves without waiting -- while the qkv
            # projection still runs.  The values, and so the bits, are the wait-first binary's.
            if FUSED:
                ej = tl.arange(0, BLOCK_H)
                ejm = (ej < HALF) & live
                e0, e1 = _halves(ej, HALF, INTERLEAVED)
                if QK_NORM:
                    ewq0 = tl.load(QN + e0, mask=ejm, other=0.0)
                    ewq1 = tl.load(QN + e1, mask=ejm, other=0.0)
                    ewk0 = tl.load(KN + e0, mask=ejm, other=0.0)
                    ewk1 = tl.load(KN + e1, mask=ejm, other=0.0)
                if ROPE:
                    ecs = tl.load(COS + pos * HALF + ej, mask=ejm, other=0.0)
                    esn = tl.load(SIN + pos * HALF + ej, mask=ejm, other=0.0)
            if live | pf:
                _pdl_prefetch_begin(pf, s, PF0, PN0, PF1, PN1, PF2, PN2, PCH, PDL, NPF, PF_LANES)
        if live:
            # Columns of the [*, 2 * BLOCK_H] tiles: the two rotation halves joined.  `dm` is the
            # memory dim of column c, `cv` whether it is a real dim (D need not be a power of 2).
            dm, cv = _columns(tl.arange(0, 2 * BLOCK_H), D, HALF, BLOCK_H, INTERLEAVED)
            g = tl.arange(0, BLOCK_G)
            gm = g < G
            if FUSED:
                j = tl.arange(0, BLOCK_H)
                jm = j < HALF
                i0, i1 = _halves(j, HALF, INTERLEAVED)
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
                    if EARLY:
                        wq0, wq1, wk0, wk1 = ewq0, ewq1, ewk0, ewk1
                    else:
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
                    if EARLY:
                        cs, sn = ecs, esn
                    else:
                        cs = tl.load(COS + pos * HALF + j, mask=jm, other=0.0)
                        sn = tl.load(SIN + pos * HALF + j, mask=jm, other=0.0)
                    # q's rotation written out: through _rotate the same multiplies come out
                    # in another order (the same values; a binary the device has not timed)
                    q0, q1 = q0 * cs[None, :] - q1 * sn[None, :], q1 * cs[None, :] + q0 * sn[None, :]
                    k0, k1 = _rotate(k0, k1, cs, sn)
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
                if not PREP:
                    tl.debug_barrier()
                    q = tl.load(qp, mask=gm[:, None] & cv[None, :], other=0.0)
            else:
                q = tl.load(Q + (b * H + kvh * G + g)[:, None] * D + dm[None, :],
                            mask=gm[:, None] & cv[None, :], other=0.0)
            # PREP (prepare_rows with MUSER_CHUNK_PREP=alone): the rows are stored; nothing attends
            if not PREP:
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
                    # every tile masked: skipping the masks on the tiles the row sees whole gives the
                    # same values and a faster kernel alone, but the three-loop binary cost 0.35 ms per
                    # 1B decode step in the engine (H200, benchmarks/NOTES.md, eighth session)
                    for start in range(t_lo, t_hi, BLOCK_N):
                        m, l, acc = _decode_tile(kp, vp, start, slot, pos, lo_pos, capm, rs, hs, kvh,
                                                 dm, cv, q, lo_v, hi_v, m, l, acc, ones, scale,
                                                 softcap, BLOCK_N, SOFTCAP, RING, True, ACC_DOT)
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
                        M, L, A = _fold(MS, LS, ACC, pid * NSPLIT, g_first - a0,
                                        g_last - g_first + 1, a0,
                                        gc, gcm, dm, cv, G, D, GS, False, DEPTH, BLOCK_GC, 2 * BLOCK_H)
                        if ngrp > 1:                      # park the group's total in its first slot
                            gb = (pid * NSPLIT + g_first - a0) * G + gc
                            tl.store(MS + gb, M, mask=gcm)
                            tl.store(LS + gb, L, mask=gcm)
                            tl.store(ACC + gb[:, None] * D + dm[None, :], A,
                                     mask=gcm[:, None] & cv[None, :])
                            tl.debug_barrier()
                            top = tl.atomic_add(CNT + pid, 1, sem="acq_rel", scope="gpu")
                            if top == ngrp - 1:
                                tl.store(CNT + pid, 0)
                                # (a chunk folds one group's total into an empty total too: exact)
                                M, L, A = _fold(MS, LS, ACC, pid * NSPLIT, 0, ngrp, a0, gc, gcm, dm, cv,
                                                G, D, GS, True, DEPTH, BLOCK_GC, 2 * BLOCK_H)
                                _row_out(O, SNK, b, kvh, gc, gcm, dm, cv, M, L, A, H, G, D,
                                         SINKS)
                        else:
                            _row_out(O, SNK, b, kvh, gc, gcm, dm, cv, M, L, A, H, G, D, SINKS)

    return attn_kernel
