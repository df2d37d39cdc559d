"""The decode attention's merge of parked partials (Triton): `merge_pieces()` -> `_load_parked`
and `_fold`, by the names triton_decode_kernel.py's kernel calls them.

Owns: reading the i-th parked (max, sum, acc) partial of a merge group (or of the groups' totals)
and folding `count` of them, in order, into an empty total with triton_attn's `merge_one` -- the
chunk kernel's order and arithmetic, so a decode row's merge is a chunk row's.  Does not own: who
merges (the elections: triton_decode_kernel.py), the merge step itself (triton_attn.py).
"""
from __future__ import annotations

import functools

from .triton_attn import pieces


@functools.lru_cache(maxsize=None)
def merge_pieces() -> dict:
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals
    globals().update(pieces())          # and the pieces there

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
        them (the fold is load-latency-bound: a ring row's 17 splits are 17 rounds at DEPTH 1;
        H200, one 1B-shape launch at 2k: ring 10.5 / 9.8 / 11.2 us, growing 15.1 / 12.7 / 16.0
        at DEPTH 1 / 4 / 8, thirty-third session); a partial past `count` is empty and folds as
        an exact no-op, so the bits are DEPTH's to choose freely."""
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
    return {"_load_parked": load_parked, "_fold": fold}
