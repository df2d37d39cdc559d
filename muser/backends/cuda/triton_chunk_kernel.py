"""The chunk attention's Triton kernel (`_kernel()`: compiled on first use).

Owns the program's walk: one program = one tile of BM query slots (BM // G query rows x the G
heads of one KV head), its rows' splits in order:

    for each split a touching the tile's rows:      (m, l, acc) = empty
        for each tile of keys in the split:          tile_step   (masked per row)
        group  <- merge_one(group, split)
        at a group's last split, or the tile's last:  total <- merge_one(total, group)

A decode step folds the same partials in the same order (triton_decode.py), so each row gets
the decode step's bits; splits and tiles a row does not reach fold as exact no-ops.  Keys are
read by position: row (x - first) of an ordered view, or (rot + x - first) mod capacity of a
ring read in place.  The loop forms (nested, flat, aligned), `tile_first`, the value-column
slices and the parked splits are described with the call (triton_chunk.py) that picks them.
Does not own: the call and its launch shape (triton_chunk.chunk_attention, chunk_route.py), the
pieces the kernel is built of (triton_attn.pieces, triton_chunk_tiles.chunk_pieces).
"""
from __future__ import annotations

import functools

from .triton_attn import pieces
from .triton_chunk_tiles import chunk_pieces


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    globals().update(pieces())
    globals().update(chunk_pieces())

    @triton.jit(do_not_specialize=["start", "R", "first", "rot", "capm", "kcount", "window",
                                   "nsp"])
    def chunk_kernel(Q, K, V, O, SNK, K2, V2, TAB, META, MS, LS, ACC, start, R, first, rot, capm,
                     kcount, rs, hs, window, scale, softcap, nsp,
                     H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                     HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
                     BM: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                     SPLIT: tl.constexpr, GS: tl.constexpr, SOFTCAP: tl.constexpr,
                     SINKS: tl.constexpr, RING: tl.constexpr, FLAT: tl.constexpr,
                     DSPLIT: tl.constexpr, INTERIOR: tl.constexpr, ACC_DOT: tl.constexpr,
                     TWO: tl.constexpr, DEV: tl.constexpr, ONE: tl.constexpr,
                     PARK: tl.constexpr, FLATTEN: tl.constexpr = False,
                     ALIGN: tl.constexpr = False, LIVE: tl.constexpr = False,
                     HEAVY: tl.constexpr = False, HINTS: tl.constexpr = False,
                     FENCE: tl.constexpr = False, WHOLE: tl.constexpr = False,
                     BASE: tl.constexpr = False):
        if DEV:
            # a captured pass (chunk_graph.py): the plane and the chunk's place come from device
            # memory -- TAB (k_ptr, v_ptr, row stride, head stride), META (start, rows, first,
            # rot, capacity or 0, history rows) -- so one graph serves every position
            # HINTS (keys in one ordered view, chunk_graph's staged keys): told the alignment
            # plane_row checked, the K/V tiles load as the eager kernel's (16-byte async copies,
            # pipelined); without it (the chunk's own rows apart, TWO) a pointer read from
            # memory is 2-byte aligned as far as Triton knows: scalar loads, yet told it there,
            # the binaries spilled more and a 512-token prefill ran 3-6% slower (twelfth session)
            if HINTS:
                K, V, rs, hs = _plane_at(TAB, O.dtype.element_ty, D)
            else:
                K = tl.load(TAB).to(tl.pointer_type(O.dtype.element_ty))
                V = tl.load(TAB + 1).to(tl.pointer_type(O.dtype.element_ty))
                rs = tl.load(TAB + 2)
                hs = tl.load(TAB + 3)
            start = tl.load(META)
            R = tl.load(META + 1)
            first = tl.load(META + 2)
            rot = tl.load(META + 3)
            capm = tl.load(META + 4)
            kcount = tl.load(META + 5)
        if HEAVY:                                # the tiles with the most keys start first
            t = tl.num_programs(0) - 1 - tl.program_id(0)
        else:
            t = tl.program_id(0)
        kvh = tl.program_id(1)
        part = tl.program_id(2)                  # which 1 / DSPLIT of the value columns
        i = tl.arange(0, BM)
        KEEP: tl.constexpr = not ALIGN           # tile_step's state-keeping select
        # ALIGN (a growing plane, no window; ROWS divides BLOCK_N): a program's rows are the
        # chunk's positions in one aligned run of ROWS, so they never straddle a key tile and
        # every row sees a key of every tile and split the program walks -- tile_step's
        # state-keeping select never picks the old state (KEEP False leaves it out)
        #   positions  |start ... |ROWS-aligned | ... |   program t: [t*ROWS - shift, +ROWS)
        # (r and rv in separate branches: so the default binaries keep their instruction order)
        if ALIGN:
            shift = start % ROWS
            r = t * ROWS + i // G - shift
        else:
            r = t * ROWS + i // G                # query row of slot i
        hg = i % G                               # its head within the KV group
        if ALIGN:
            rv = (i < ROWS * G) & (r >= 0) & (r < R)
        else:
            rv = (i < ROWS * G) & (r < R)
        # columns as the decode kernel lays them out
        dm, cv = _columns(tl.arange(0, 2 * BLOCK_H), D, HALF, BLOCK_H, INTERLEAVED)
        # value / output columns of this program: a slice of the same column order (a column of
        # p @ V is its own sum over the keys, so slicing them changes no bit; every program
        # recomputes the scores -- 1.5x the FLOPs at DSPLIT 2 for half the accumulator
        # registers: no spills, yet slower on the H200)
        DPW: tl.constexpr = 2 * BLOCK_H // DSPLIT
        if PARK:                                 # grid axis 2 is the split (DSPLIT 1)
            dmv, cvv = _columns(tl.arange(0, DPW), D, HALF, BLOCK_H, INTERLEAVED)
        else:
            dmv, cvv = _columns(part * DPW + tl.arange(0, DPW), D, HALF, BLOCK_H, INTERLEAVED)
        p = start + r
        lo = tl.where(window > 0, tl.maximum(p - window + 1, 0), 0)
        hi = tl.where(rv, p + 1, lo)             # slots past the chunk see nothing
        heads = kvh * G + hg
        q = tl.load(Q + (r.to(tl.int64) * H + heads)[:, None] * D + dm[None, :],
                    mask=rv[:, None] & cv[None, :], other=0.0)
        # (triton_chunk_park's fold repeats these lines: as a shared helper they compiled in
        # another order, and these binaries are the ones measured on the H200)
        if ALIGN:
            r_end = tl.minimum(t * ROWS + ROWS - shift, R)
            p_min = start + tl.maximum(t * ROWS - shift, 0)
        else:
            r_end = tl.minimum(t * ROWS + ROWS, R)
            p_min = start + t * ROWS
        p_max = start + r_end - 1
        if DEV:
            if ALIGN:
                # a captured pass launches ceil((R + ROWS - 1) / ROWS) tiles (its start, so its
                # shift, is read here): a last tile past the chunk walks no key (p_max -1)
                p_max = tl.where(t * ROWS - shift < R, p_max, -1)
        lo_min = tl.where(window > 0, tl.maximum(p_min - window + 1, 0), 0)
        a_hi = p_max // SPLIT
        ones = tl.full([BLOCK_N, 16], 1.0, O.dtype.element_ty)
        Mt = tl.full([BM], float("-inf"), tl.float32)
        Mg = tl.full([BM], float("-inf"), tl.float32)
        if LIVE:                                 # merge_live's empty state (triton_attn.py)
            Lt = tl.full([BM], -0.0, tl.float32)
            At = tl.full([BM, DPW], -0.0, tl.float32)
            Lg = tl.full([BM], -0.0, tl.float32)
            Ag = tl.full([BM, DPW], -0.0, tl.float32)
        else:
            Lt = tl.zeros([BM], tl.float32)
            At = tl.zeros([BM, DPW], tl.float32)
            Lg = tl.zeros([BM], tl.float32)
            Ag = tl.zeros([BM, DPW], tl.float32)
        t_first = (lo_min // BLOCK_N) * BLOCK_N
        # Key tiles every row of this program sees whole: [f0, f1) -- past the last row's window
        # start, before the first row's position.  There (INTERIOR) tile_step leaves out the
        # masks, which would select nothing away: the same values.  Edge tiles stay masked.
        #   keys  |--masked--|===== whole for every row =====|--masked (diagonal)--|
        #       t_first      f0                              f1                p_max
        lo_max = tl.where(window > 0, tl.maximum(p_max - window + 1, 0), 0)
        f0 = (lo_max + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        f1 = (p_min + 1) // BLOCK_N * BLOCK_N
        if PARK:
            # one split of the tile's rows a program (grid axis 2; triton_chunk_park.py folds
            # them): the nested loop's split body, from empty, its (m, l, acc) parked in order
            a = lo_min // SPLIT + part
            if a <= a_hi:
                m, l, acc = _split_partial(a, t_first, p_max, f0, f1, K, V, first, rot, capm,
                                           kcount, lo_min, rs, hs, kvh, dm, cv, dmv, cvv, q, lo,
                                           hi, ones, scale, softcap, K2, V2, start, BM, DPW,
                                           BLOCK_N, SPLIT, SOFTCAP, RING, INTERIOR, ACC_DOT, TWO,
                                           KV, D)
                slot = ((t * KV + kvh) * nsp + part).to(tl.int64) * BM + i     # [BM]
                tl.store(MS + slot, m)
                tl.store(LS + slot, l)
                tl.store(ACC + slot[:, None] * DPW + tl.arange(0, DPW)[None, :], acc)
        else:
            if FLAT:
                # one loop over the tiles (three: masked, whole, masked), split and group boundaries
                # inside it: the same sequence of tile_step / merge_one as below (so the same bits),
                # but loops long enough for the compiler's software pipelining to prefetch K/V
                # tiles (a ring split is 1 tile)
                m = tl.full([BM], float("-inf"), tl.float32)
                l = tl.zeros([BM], tl.float32)
                acc = tl.zeros([BM, DPW], tl.float32)
                a1 = p_max + 1
                b1 = p_max + 1
                if INTERIOR:
                    a1 = tl.minimum(tl.maximum(f0, t_first), p_max + 1)
                    b1 = tl.maximum(a1, tl.minimum(f1, p_max + 1))
                if LIVE:
                    # aligned row runs (a growing plane): the tiles before the diagonal one
                    # unmasked, the diagonal masked; no selects (triton_chunk_tiles.py)
                    Kw = K
                    Vw = V
                    fw = first
                    kw = kvh
                    if WHOLE and BASE:
                        # whole tiles read the view's row x at Kw + x * rs: one base a program
                        # (the same addresses; a captured pass keeps fewer of the values it
                        # loads from TAB / META live through the loop -- sm_90 spills 208 ->
                        # 144 B, the loop's local loads / stores 18 -> 10)
                        off = kvh * hs - first.to(tl.int64) * rs
                        Kw = K + off
                        Vw = V + off
                        fw = 0
                        kw = 0
                    for st in range(t_first, b1, BLOCK_N):
                        m, l, acc, Mg, Lg, Ag, Mt, Lt, At = _flat_tile_live(
                            st, t_first, p_max, Kw, Vw, fw, rot, capm, kcount, lo_min, rs, hs,
                            kw, dm, cv, dmv, cvv, q, lo, hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At,
                            ones, scale, softcap, K2, V2, start, BM, DPW, BLOCK_N, SPLIT, GS,
                            SOFTCAP, RING, not INTERIOR, ACC_DOT, TWO, KV, D, FENCE, WHOLE)
                    for st in range(b1, p_max + 1, BLOCK_N):
                        m, l, acc, Mg, Lg, Ag, Mt, Lt, At = _flat_tile_live(
                            st, t_first, p_max, K, V, first, rot, capm, kcount, lo_min, rs, hs,
                            kvh, dm, cv, dmv, cvv, q, lo, hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At,
                            ones, scale, softcap, K2, V2, start, BM, DPW, BLOCK_N, SPLIT, GS,
                            SOFTCAP, RING, True, ACC_DOT, TWO, KV, D, FENCE)
                else:
                    for st in range(t_first, a1, BLOCK_N):
                        m, l, acc, Mg, Lg, Ag, Mt, Lt, At = _flat_tile(
                            st, t_first, p_max, K, V, first, rot, capm, kcount, lo_min, rs, hs,
                            kvh, dm, cv, dmv, cvv, q, lo, hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At,
                            ones, scale, softcap, K2, V2, start, BM, DPW, BLOCK_N, SPLIT, GS,
                            SOFTCAP, RING, True, ACC_DOT, TWO, KV, D, ONE)
                    for st in range(a1, b1, BLOCK_N):
                        m, l, acc, Mg, Lg, Ag, Mt, Lt, At = _flat_tile(
                            st, t_first, p_max, K, V, first, rot, capm, kcount, lo_min, rs, hs,
                            kvh, dm, cv, dmv, cvv, q, lo, hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At,
                            ones, scale, softcap, K2, V2, start, BM, DPW, BLOCK_N, SPLIT, GS,
                            SOFTCAP, RING, False, ACC_DOT, TWO, KV, D, ONE)
                    for st in range(b1, p_max + 1, BLOCK_N):
                        m, l, acc, Mg, Lg, Ag, Mt, Lt, At = _flat_tile(
                            st, t_first, p_max, K, V, first, rot, capm, kcount, lo_min, rs, hs,
                            kvh, dm, cv, dmv, cvv, q, lo, hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At,
                            ones, scale, softcap, K2, V2, start, BM, DPW, BLOCK_N, SPLIT, GS,
                            SOFTCAP, RING, True, ACC_DOT, TWO, KV, D, ONE)
            elif FLATTEN:
                # the nested loop with every split's tiles on fixed bounds (masked; tiles no row
                # sees fold as exact no-ops, as the tile's rows past a row's own position already
                # do), so Triton fuses the two loops into one software-pipelined loop: the
                # split's merges run at its last tile only, in the same order
                for a in tl.range(lo_min // SPLIT, a_hi + 1, flatten=True):
                    m = tl.full([BM], float("-inf"), tl.float32)
                    l = tl.zeros([BM], tl.float32)
                    acc = tl.zeros([BM, DPW], tl.float32)
                    for j in range(SPLIT // BLOCK_N):
                        m, l, acc = _keys_tile(a * SPLIT + j * BLOCK_N, K, V, first, rot, capm,
                                               kcount, lo_min, p_max, rs, hs, kvh, dm, cv, dmv,
                                               cvv, q, lo, hi, m, l, acc, ones, scale, softcap,
                                               K2, V2, start, BLOCK_N, SOFTCAP, RING, True,
                                               ACC_DOT, TWO, KV, D)
                    Mg, Lg, Ag, Mt, Lt, At = _split_done_sel(a, a_hi, m, l, acc, Mg, Lg, Ag, Mt,
                                                             Lt, At, BM, DPW, GS)
            else:
                for a in range(lo_min // SPLIT, a_hi + 1):
                    m, l, acc = _split_partial(a, t_first, p_max, f0, f1, K, V, first, rot, capm,
                                               kcount, lo_min, rs, hs, kvh, dm, cv, dmv, cvv, q,
                                               lo, hi, ones, scale, softcap, K2, V2, start, BM,
                                               DPW, BLOCK_N, SPLIT, SOFTCAP, RING, INTERIOR,
                                               ACC_DOT, TWO, KV, D, KEEP)
                    if LIVE:
                        Mg, Lg, Ag, Mt, Lt, At = _split_done_live(a, a_hi, m, l, acc, Mg, Lg, Ag,
                                                                  Mt, Lt, At, BM, DPW, GS)
                    else:
                        Mg, Lg, Ag, Mt, Lt, At = _split_done(a, a_hi, m, l, acc, Mg, Lg, Ag, Mt,
                                                             Lt, At, BM, DPW, GS)
            if SINKS:
                Mt, Lt, At = _sink(SNK, heads, rv, Mt, Lt, At)
            tl.store(O + (r.to(tl.int64) * H + heads)[:, None] * D + dmv[None, :],
                     (At / Lt[:, None]).to(O.dtype.element_ty), mask=rv[:, None] & cvv[None, :])

    return chunk_kernel
