"""The chunk attention kernel's per-tile pieces (Triton): what triton_chunk.py's loops call.

Owns: `chunk_pieces()` -- `_chunk_tile` (a tile of K/V read by position: an ordered view, a
ring in place, and with TWO the chunk's own rows from `start` on), `_keys_tile` (that tile
folded into a split's running softmax), `_split_partial` (a split from empty), `_split_done` /
`_group_end` (the merges at a split's and a group's end) and `_flat_tile` (one step of the flat
loop: a split starts, folds, and ends into its group and the total; `_flat_tile_live` the same
for aligned row runs, without selects).  Does not own: the loops
and the grid (triton_chunk.py), the arithmetic they share with the decode kernel
(triton_attn.py).
"""
from __future__ import annotations

import functools

from .triton_attn import pieces


@functools.lru_cache(maxsize=None)
def chunk_pieces() -> dict:
    """The @triton.jit helpers, by the names the chunk kernel calls them."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for names in module globals
    globals().update(pieces())

    @triton.jit
    def chunk_tile(K, V, kpos, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh, dm, cv,
                   dmv, cvv, K2, V2, start, RING: tl.constexpr, TWO: tl.constexpr,
                   KV: tl.constexpr, D: tl.constexpr, WHOLE: tl.constexpr = False):
        """The K and V tiles of key positions kpos, read by position (zeros outside the rows
        any query of the tile sees, or outside the view); V's columns are this program's slice.
        TWO: positions from `start` on are the chunk's own rows, K2 / V2 [R, KV, D] (row x -
        start); the plane holds only the history (a captured pass stores after attending).
        WHOLE (MUSER_CHUNK_WHOLE; an ordered view, no second buffer): the caller knows every
        key of the tile is one each row sees, so in the view -- the row masks would all be
        true: left out (the same values; only the columns past D stay masked)."""
        if WHOLE:
            rows = (kpos - first)[:, None].to(tl.int64) * rs + kvh * hs
            return (tl.load(K + rows + dm[None, :], mask=cv[None, :], other=0.0),
                    tl.load(V + rows + dmv[None, :], mask=cvv[None, :], other=0.0))
        idx = kpos - first
        km = (kpos >= lo_min) & (kpos <= p_max)
        if TWO:
            new = kpos >= start
            km_old = km & (kpos < start)
        else:
            km_old = km
        if RING:
            # a key some row reads is held: idx in [0, capm), so rot + idx in [0, 2 capm) -- a
            # conditional subtract wraps it (and an add covers [-capm, 0) as the remainder did);
            # an int64 `%` here is a division per key row (the decode kernel's load_kv)
            idx = rot + idx
            idx = tl.where(idx >= capm, idx - capm, idx)
            idx = tl.where(idx < 0, idx + capm, idx)
        else:
            km_old = km_old & (idx >= 0) & (idx < kcount)
        rows = idx[:, None].to(tl.int64) * rs + kvh * hs
        k = tl.load(K + rows + dm[None, :], mask=km_old[:, None] & cv[None, :], other=0.0)
        v = tl.load(V + rows + dmv[None, :], mask=km_old[:, None] & cvv[None, :], other=0.0)
        if TWO:                     # a select, not a sum: -0.0 stays -0.0
            nrows = (kpos - start)[:, None].to(tl.int64) * (KV * D) + kvh * D
            km_new = km & new
            k2 = tl.load(K2 + nrows + dm[None, :], mask=km_new[:, None] & cv[None, :], other=0.0)
            v2 = tl.load(V2 + nrows + dmv[None, :], mask=km_new[:, None] & cvv[None, :], other=0.0)
            k = tl.where(new[:, None], k2, k)
            v = tl.where(new[:, None], v2, v)
        return k, v

    globals()["_chunk_tile"] = chunk_tile

    @triton.jit
    def keys_tile(st, K, V, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh, dm, cv, dmv, cvv,
                  q, lo, hi, m, l, acc, ones, scale, softcap, K2, V2, start,
                  BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr, RING: tl.constexpr,
                  MASKED: tl.constexpr, ACC_DOT: tl.constexpr, TWO: tl.constexpr,
                  KV: tl.constexpr, D: tl.constexpr, FIRST: tl.constexpr = False,
                  KEEP: tl.constexpr = True, WHOLE: tl.constexpr = False):
        """The tile of keys at positions st.. folded into the split's running softmax (FIRST: a
        split's first tile, from the empty state, which m / l / acc then are not read as;
        KEEP: tile_step's; WHOLE: _chunk_tile's)."""
        kpos = st + tl.arange(0, BLOCK_N)
        k, v = _chunk_tile(K, V, kpos, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh, dm,
                           cv, dmv, cvv, K2, V2, start, RING, TWO, KV, D, WHOLE)
        if FIRST:
            return _tile_first(q, k, v, kpos, lo, hi, ones, scale, softcap, SOFTCAP, MASKED)
        return _tile_step(q, k, v, kpos, lo, hi, m, l, acc, ones, scale, softcap, SOFTCAP,
                          MASKED, ACC_DOT, KEEP)

    globals()["_keys_tile"] = keys_tile

    @triton.jit
    def split_partial(a, t_first, p_max, f0, f1, K, V, first, rot, capm, kcount, lo_min, rs, hs,
                      kvh, dm, cv, dmv, cvv, q, lo, hi, ones, scale, softcap, K2, V2, start,
                      BM: tl.constexpr, DPW: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLIT: tl.constexpr, SOFTCAP: tl.constexpr, RING: tl.constexpr,
                      INTERIOR: tl.constexpr, ACC_DOT: tl.constexpr, TWO: tl.constexpr,
                      KV: tl.constexpr, D: tl.constexpr, KEEP: tl.constexpr = True):
        """Split a's partial (m, l, acc) for a tile's rows, from empty: its key tiles in order,
        the ones every row sees whole ([f0, f1), INTERIOR) without masks -- the nested loop's
        body, and a parked program's whole work (KEEP: tile_step's)."""
        m = tl.full([BM], float("-inf"), tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, DPW], tl.float32)
        t_lo = tl.maximum(a * SPLIT, t_first)
        t_hi = tl.minimum(a * SPLIT + SPLIT, p_max + 1)
        a1 = t_hi
        b1 = t_hi
        if INTERIOR:
            a1 = tl.minimum(tl.maximum(f0, t_lo), t_hi)
            b1 = tl.maximum(a1, tl.minimum(f1, t_hi))
        for st in range(t_lo, a1, BLOCK_N):
            m, l, acc = _keys_tile(st, K, V, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh,
                                   dm, cv, dmv, cvv, q, lo, hi, m, l, acc, ones, scale, softcap,
                                   K2, V2, start, BLOCK_N, SOFTCAP, RING, True, ACC_DOT, TWO,
                                   KV, D, False, KEEP)
        for st in range(a1, b1, BLOCK_N):
            m, l, acc = _keys_tile(st, K, V, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh,
                                   dm, cv, dmv, cvv, q, lo, hi, m, l, acc, ones, scale, softcap,
                                   K2, V2, start, BLOCK_N, SOFTCAP, RING, False, ACC_DOT, TWO,
                                   KV, D)
        for st in range(b1, t_hi, BLOCK_N):
            m, l, acc = _keys_tile(st, K, V, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh,
                                   dm, cv, dmv, cvv, q, lo, hi, m, l, acc, ones, scale, softcap,
                                   K2, V2, start, BLOCK_N, SOFTCAP, RING, True, ACC_DOT, TWO,
                                   KV, D, False, KEEP)
        return m, l, acc

    globals()["_split_partial"] = split_partial

    @triton.jit
    def split_done(a, a_hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At, BM: tl.constexpr,
                   DPW: tl.constexpr, GS: tl.constexpr):
        """Split a's partial into its group; at the group's last split (or the tile's last,
        a_hi) the group into the total -- the merge order every route shares."""
        Mg, Lg, Ag = _merge_one(Mg, Lg, Ag, m, l, acc)
        if (a % GS == GS - 1) | (a == a_hi):
            Mt, Lt, At, Mg, Lg, Ag = _group_end(Mt, Lt, At, Mg, Lg, Ag, BM, DPW)
        return Mg, Lg, Ag, Mt, Lt, At

    @triton.jit
    def group_end(Mt, Lt, At, Mg, Lg, Ag, BM: tl.constexpr, DPW: tl.constexpr):
        """A group ends: it folds into the total and starts again empty."""
        Mt, Lt, At = _merge_one(Mt, Lt, At, Mg, Lg, Ag)
        return (Mt, Lt, At, tl.full([BM], float("-inf"), tl.float32), tl.zeros([BM], tl.float32),
                tl.zeros([BM, DPW], tl.float32))

    globals()["_group_end"] = group_end

    @triton.jit
    def split_done_sel(a, a_hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At, BM: tl.constexpr,
                       DPW: tl.constexpr, GS: tl.constexpr):
        """`split_done` without a branch: the group's fold into the total is computed at every
        split and kept (with the group reset) only at a group's end -- the same values, for a
        loop Triton fuses (its fuse-nested-loops pass fails on an if inside the epilogue)."""
        Mg, Lg, Ag = _merge_one(Mg, Lg, Ag, m, l, acc)
        Mn, Ln, An = _merge_one(Mt, Lt, At, Mg, Lg, Ag)
        end = (a % GS == GS - 1) | (a == a_hi)
        Mt = tl.where(end, Mn, Mt)
        Lt = tl.where(end, Ln, Lt)
        At = tl.where(end, An, At)
        Mg = tl.where(end, float("-inf"), Mg)
        Lg = tl.where(end, 0.0, Lg)
        Ag = tl.where(end, 0.0, Ag)
        return Mg, Lg, Ag, Mt, Lt, At

    @triton.jit
    def split_done_live(a, a_hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At, BM: tl.constexpr,
                        DPW: tl.constexpr, GS: tl.constexpr):
        """`split_done` with merge_live (aligned row runs: no split is empty, the group and the
        total start at (-inf, -0.0, -0.0)): the same values, no [BM, D] selects."""
        Mg, Lg, Ag = _merge_live(Mg, Lg, Ag, m, l, acc)
        if (a % GS == GS - 1) | (a == a_hi):
            Mt, Lt, At = _merge_live(Mt, Lt, At, Mg, Lg, Ag)
            Mg = tl.full([BM], float("-inf"), tl.float32)
            Lg = tl.full([BM], -0.0, tl.float32)
            Ag = tl.full([BM, DPW], -0.0, tl.float32)
        return Mg, Lg, Ag, Mt, Lt, At

    globals()["_split_done_live"] = split_done_live
    globals()["_split_done_sel"] = split_done_sel
    globals()["_split_done"] = split_done

    @triton.jit
    def flat_tile(st, t_first, p_max, K, V, first, rot, capm, kcount, lo_min, rs, hs, kvh, dm, cv,
                  dmv, cvv, q, lo, hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At, ones, scale, softcap,
                  K2, V2, start, BM: tl.constexpr, DPW: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPLIT: tl.constexpr, GS: tl.constexpr, SOFTCAP: tl.constexpr,
                  RING: tl.constexpr, MASKED: tl.constexpr, ACC_DOT: tl.constexpr,
                  TWO: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, ONE: tl.constexpr):
        """One step of the flat loop: a split starts (from empty) at its first tile, the tile
        folds in, and where the split ends it folds into its group, a group into the total.
        ONE: every split is one tile (a ring's, SPLIT == BLOCK_N: t_first and every step are
        multiples of it), so every tile starts its split -- `tile_first`, no state to reset."""
        if ONE:
            m, l, acc = _keys_tile(st, K, V, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh,
                                   dm, cv, dmv, cvv, q, lo, hi, m, l, acc, ones, scale, softcap,
                                   K2, V2, start, BLOCK_N, SOFTCAP, RING, MASKED, ACC_DOT, TWO,
                                   KV, D, True)
        else:
            fresh = (st % SPLIT == 0) | (st == t_first)
            m = tl.where(fresh, float("-inf"), m)
            l = tl.where(fresh, 0.0, l)
            acc = tl.where(fresh, 0.0, acc)
            m, l, acc = _keys_tile(st, K, V, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh,
                                   dm, cv, dmv, cvv, q, lo, hi, m, l, acc, ones, scale, softcap,
                                   K2, V2, start, BLOCK_N, SOFTCAP, RING, MASKED, ACC_DOT, TWO,
                                   KV, D)
        last = st + BLOCK_N > p_max
        if ONE:
            # every tile ends its split: its merge unconditional.  (Under the runtime `if`
            # below, Triton 3.6's software pipeliner fails -- "PassManager::run failed" in
            # TritonGPUPipeline -- on a dot whose result only that `if` reads.)
            Mg, Lg, Ag = _merge_one(Mg, Lg, Ag, m, l, acc)
            if ((st // SPLIT) % GS == GS - 1) | last:
                Mt, Lt, At, Mg, Lg, Ag = _group_end(Mt, Lt, At, Mg, Lg, Ag, BM, DPW)
        elif ((st + BLOCK_N) % SPLIT == 0) | last:          # the split ends here
            Mg, Lg, Ag = _merge_one(Mg, Lg, Ag, m, l, acc)
            if ((st // SPLIT) % GS == GS - 1) | last:
                Mt, Lt, At, Mg, Lg, Ag = _group_end(Mt, Lt, At, Mg, Lg, Ag, BM, DPW)
        return m, l, acc, Mg, Lg, Ag, Mt, Lt, At

    globals()["_flat_tile"] = flat_tile

    @triton.jit
    def flat_tile_live(st, t_first, p_max, K, V, first, rot, capm, kcount, lo_min, rs, hs, kvh,
                       dm, cv, dmv, cvv, q, lo, hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At, ones,
                       scale, softcap, K2, V2, start, BM: tl.constexpr, DPW: tl.constexpr,
                       BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, GS: tl.constexpr,
                       SOFTCAP: tl.constexpr, RING: tl.constexpr, MASKED: tl.constexpr,
                       ACC_DOT: tl.constexpr, TWO: tl.constexpr, KV: tl.constexpr,
                       D: tl.constexpr, FENCE: tl.constexpr = False,
                       WHOLE: tl.constexpr = False):
        """`flat_tile` for aligned row runs (triton_chunk.py's ALIGN with LIVE): no select
        anywhere.  The split's state is reset where the split ends, inside the branch that
        merges it, to the (-inf, +0, +0) a nested split starts from -- not selected back at
        the next split's first tile -- and its merges are `split_done_live`'s: the same
        tile_step / merge sequence as the aligned nested loop, so the same bits.

        FENCE (MUSER_CHUNK_FENCE): p @ V's result passes through an opaque move (a bit copy)
        before the split-end branch.  Why: the branch's merge reads the accumulator the
        async wgmma writes, and Triton places that wgmma's wait at the next iteration's first
        dot -- so ptxas finds a read inside the wgmma's pipeline stage and serializes EVERY
        wgmma of the kernel (C7515: "instructions are serialized due to non wgmma instructions
        reading/defining accumulator registers").  An unconditional first use -- the move --
        makes Triton wait right there; ptxas then keeps the QK chain pipelined (sm_90,
        Triton 3.6: the eager and staged binaries compile without C7515, spills 8 -> 0 and
        232 -> 224 B).  The same values: a move copies bits.  WHOLE: an unmasked tile's K / V
        load without row masks (_chunk_tile)."""
        m, l, acc = _keys_tile(st, K, V, first, rot, capm, kcount, lo_min, p_max, rs, hs, kvh,
                               dm, cv, dmv, cvv, q, lo, hi, m, l, acc, ones, scale, softcap,
                               K2, V2, start, BLOCK_N, SOFTCAP, RING, MASKED, ACC_DOT, TWO,
                               KV, D, False, False, WHOLE and not MASKED)
        if FENCE:
            acc = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=tl.float32,
                                            is_pure=True, pack=1)
        if ((st + BLOCK_N) % SPLIT == 0) | (st + BLOCK_N > p_max):       # the split ends here
            Mg, Lg, Ag, Mt, Lt, At = _split_done_live(st // SPLIT, p_max // SPLIT, m, l, acc,
                                                      Mg, Lg, Ag, Mt, Lt, At, BM, DPW, GS)
            m = tl.full([BM], float("-inf"), tl.float32)
            l = tl.zeros([BM], tl.float32)
            acc = tl.zeros([BM, DPW], tl.float32)
        return m, l, acc, Mg, Lg, Ag, Mt, Lt, At

    globals()["_flat_tile_live"] = flat_tile_live

    return {"_chunk_tile": chunk_tile, "_keys_tile": keys_tile, "_split_partial": split_partial,
            "_group_end": group_end, "_split_done": split_done,
            "_split_done_sel": split_done_sel, "_split_done_live": split_done_live,
            "_flat_tile": flat_tile, "_flat_tile_live": flat_tile_live}
