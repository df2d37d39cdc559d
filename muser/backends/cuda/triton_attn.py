"""The one attention arithmetic of a CUDA row: what a decode step and a chunk share.

Owns: `layout(growing, head_dim, env)` -- the reduction shape of a layer's
attention (positions per split, splits per merge group, keys per tile, warps)
-- and the Triton pieces both kernels run on it: `tile_step` (one tile of keys
into a row's running softmax), `merge_one` (one partial into a running
total) and `sink`.  Does not own: where keys live or how they are read
(triton_decode.py reads a plane in place, triton_chunk.py a staged view), except
`plane_at`: a plane-table row as both read it.

Why a row's bits cannot depend on how it was computed ("one arithmetic per
token", docs/exactness.md).  A query at position p attends over positions
[lo, p].  Both kernels cut the positions at ABSOLUTE boundaries, never at
boundaries that depend on n or on the other rows:

    positions  0 ........ S ........ 2S ........ 3S ....
    splits     |  a = 0   |  a = 1   |  a = 2   | ...      S = layout.split
    tiles      |BN|BN|BN|BN|..                             BN = layout.block_n
    groups     splits a // GS                              GS = layout.group

Per split: start from (m, l, acc) = (-inf, 0, 0), fold its tiles in order
(`tile_step`).  Per group: fold its splits in order (`merge_one`), starting
empty.  Total: fold the groups in order.  A decode step computes the splits in
parallel programs and merges them afterwards; a chunk walks them in one
program for a tile of query rows; the values folded and their order are the
same.  Keys a row may not see (and tiles or splits wholly outside its range)
fold as exact no-ops: masked scores are -inf, their weights exactly 0, and
the guards keep exp(-inf - -inf) out.  Every reduction that could depend on
the tile's row count is a tensor-core dot over the keys (`l` is p summed by a
dot with ones, in the order the p @ V dot sums), so a chunk may put 64 query
rows in a tile where a decode step puts one row's 16 head slots.  The max
is exact in any order.  Both kernels compile with `enable_fp_fusion=False`: which
multiply-add the compiler contracts into an FMA follows the surrounding code (a value loaded
or carried in a loop), so with contraction on, the same `L * alpha + w * l` rounded
differently in the two kernels (H200: 10 of 150 rows one bf16 step apart).  The one
FMA the arithmetic has is written out (`weights`, ARITHMETIC 3), so both kernels take it.
"""
from __future__ import annotations

import functools

from muser.env import Env

from .triton_pieces import _pow2

# Positions per split and splits per merge group live in Env (MUSER_RING_ROWS = 32,
# MUSER_GROWING_ROWS = 128, MUSER_RING_GROUP = 4, MUSER_GROWING_GROUP = 16).  H200,
# Gemma-3-1B shape: rings of 64 or 128 positions were slower at 2k; growing 128 against 64:
# 32k decode -4%, the rest even; ring groups of 4 against one group: a ring layer's decode
# attention 12.1 against 13.9 us (benchmarks/NOTES.md, seventh session).


# The CUDA exact path's arithmetic, versioned: bump it whenever a change moves a row's bits
# (tile_step / merge_one / the decode merge order, dot_rows' epilogue or K-step chaining, the
# split-K rule of triton_dot_tiles.dot_config).  It names the cut encoding (backends/cuda), so
# a cut made by another arithmetic -- an older muser, the CPU -- is refused, not continued ~.
#   1: sixth session (the decode step's arithmetic for chunks)
#   2: eighth session (p @ V accumulates onto the rescaled accumulator inside the dot)
#   3: thirty-first session (unscaled scores: the scale joins exp's argument in one FMA)
ARITHMETIC = 3
BITS_FIELDS = ("split", "group", "block_n", "acc_dot")      # the layout fields that are bits
# the layout fields only the chunk kernel reads (its loop, launch shape and route choices): a
# decode launch is given the rest (`decode_keys`), so a new chunk knob is named here only
CHUNK_KEYS = frozenset({"chunk_loop", "dsplit", "interior", "first_tile", "park", "flatten",
                        "align", "heavy", "wide", "fence", "whole", "base"})


def decode_keys(lay: dict) -> dict:
    """`lay` without the fields only the chunk kernel reads."""
    return {k: v for k, v in lay.items() if k not in CHUNK_KEYS}


def layout(growing: bool, head_dim: int, env: Env = Env()) -> dict:
    """The reduction shape of one layer's attention: {split, group, block_n, warps, depth,
    chunk_loop, dsplit, interior, acc_dot, first_tile, park, prep} (depth: parked partials a
    decode merge loads at once; chunk_loop, dsplit, first_tile and park: the chunk kernel's loop
    structure, value-column slices, one-tile splits started without a state and the row count
    up to which splits go one a program; prep: which binary prepares a chunk's rows; flatten:
    whether the growing planes' split loop is one fused loop ("chunk" / "on"); align: aligned
    row runs without the state-keeping selects (MUSER_CHUNK_ALIGN, triton_chunk.py); heavy: a
    growing plane's chunk starts its last query tiles first (MUSER_CHUNK_ORDER); wide: at head
    dim 256 each warpgroup owns whole score rows (MUSER_CHUNK_WIDE; chunk_route._wide); fence:
    the aligned flat loop waits for p @ V before its split-end branch (MUSER_CHUNK_FENCE); whole:
    its unmasked tiles load without row masks (MUSER_CHUNK_WHOLE); base: and address the view
    from one base a program (MUSER_CHUNK_BASE);
    interior: tiles every row sees whole skip the masks -- speed choices, not bits ones;
    acc_dot: p @ V accumulates onto the rescaled accumulator inside the dot -- a bits one).

    block_n: (32, 4 warps) at head dims over 128 and (64, 4) below -- the largest tiles whose
    [16, D] float32 accumulator and [block_n, D] K/V tiles compile without spilling (sm_90).
    A decode step and a chunk of the same engine must use the same layout (it is the
    arithmetic), so the tiles come from here and nowhere else."""
    tile = env.attn_growing if growing else env.attn_ring
    d2 = 2 * _pow2(head_dim // 2, 8)
    block_n, warps = tile if tile is not None else ((32 if d2 >= 256 else 64), 4)
    split = env.growing_rows if growing else env.ring_rows
    split = max(block_n, -(-split // block_n) * block_n)          # whole tiles per split
    return {"split": split, "group": env.growing_group if growing else env.ring_group,
            "block_n": block_n, "warps": warps, "depth": int(env.merge_loads),
            # auto: flat on rings and on growing splits of one tile (16k prefill, 1B global
            # layer 6.8 -> 5.4 ms, where nested one-tile splits took 2x); on longer growing
            # splits "aligned": flat where a chunk's rows run aligned without selects
            # (triton_chunk.py; 5.65 -> 5.38 ms), nested elsewhere (8.0 against 10.7 ms flat
            # with the selects)
            "chunk_loop": env.chunk_loop if env.chunk_loop != "auto" else (
                "flat" if not growing or split == block_n else "aligned"),
            "dsplit": int(env.chunk_columns), "interior": env.attn_tiles == "interior",
            "acc_dot": env.attn_acc == "dot", "first_tile": env.chunk_first == "on",
            "park": int(env.chunk_park), "prep": env.chunk_prep, "flatten": env.flatten,
            "align": {"off": False, "tiles": "tiles", "on": True}[env.chunk_align],
            "heavy": env.chunk_order == "heavy",
            "wide": env.chunk_wide == "on", "fence": env.chunk_fence == "on",
            "whole": env.chunk_whole == "on", "base": env.chunk_base == "on"}


@functools.lru_cache(maxsize=None)
def pieces() -> dict:
    """The shared @triton.jit functions, by the names the kernels call them."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals

    @triton.jit
    def scores(q, k, kpos, lo, hi, scale, softcap, SOFTCAP: tl.constexpr, MASKED: tl.constexpr):
        """A tile's scores [BM, BN], -inf where a row may not look (MASKED); which keys each
        row sees (all of them unless MASKED); and (smul, cmul), the units they come in.
        Without SOFTCAP the scores are q k^T unscaled: the row max is scaled once a row
        (smul = scale; rounding is monotone, so max(x * s) == max(x) * s bit for bit) and
        the weights take the scale inside one FMA (cmul = scale * log2 e, `weights`) -- three
        float ops a score fewer than scaling every score (ARITHMETIC 3).  With SOFTCAP the
        scores are final (smul = 1, cmul = log2 e)."""
        sc = tl.dot(q, tl.trans(k), input_precision="ieee")
        if SOFTCAP:
            sc = sc * scale
            sc = (2.0 * tl.sigmoid(2.0 * sc / softcap) - 1.0) * softcap
            smul = 1.0
        else:
            smul = scale
        valid = (kpos[None, :] >= lo[:, None]) & (kpos[None, :] < hi[:, None])
        if MASKED:
            sc = tl.where(valid, sc, float("-inf"))
        return sc, valid, smul, smul * 1.4426950408889634

    @triton.jit
    def weights(sc, m_new, cmul):
        """exp(scaled score - m_new) as exp2(sc * cmul - m_new * log2 e): one FMA and the
        MUFU a score (the log2 e product rounded once a row).  -inf scores give 0; a row
        whose m_new is -inf gives NaN here -- every caller selects such rows away."""
        return tl.exp2(tl.fma(sc, cmul, (-(m_new * 1.4426950408889634))[:, None]))

    globals()["_scores"] = scores
    globals()["_weights"] = weights

    @triton.jit
    def tile_scored(sc, smul, cmul, v, m, l, acc, ones, ACC_DOT: tl.constexpr):
        """A tile every row sees whole folded into the running softmax, its scores given in
        `scores`' units (the unmasked `tile_step`)."""
        m_new = tl.maximum(m, tl.max(sc, 1) * smul)
        alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
        p = _weights(sc, m_new, cmul).to(v.dtype)
        # the row sums on the tensor cores too: every column of p @ ones is the same sum
        l_new = l * alpha + tl.max(tl.dot(p, ones, input_precision="ieee"), 1)
        if ACC_DOT:
            # the rescaled accumulator enters the MMA chain as its start: one [BM, DP] pass less
            # (a dot's k16 steps chain onto its accumulator whatever the tile: the rows' bits
            # do not depend on BM -- benchmarks/dot_chunk_sweep.py)
            acc_new = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        else:
            acc_new = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        return m_new, l_new, acc_new

    globals()["_tile_scored"] = tile_scored

    @triton.jit
    def tile_step(q, k, v, kpos, lo, hi, m, l, acc, ones, scale, softcap, SOFTCAP: tl.constexpr,
                  MASKED: tl.constexpr, ACC_DOT: tl.constexpr, KEEP: tl.constexpr = True):
        """Fold one tile of keys into each row's running softmax.
        q [BM, DP], k/v [BN, DP], kpos [BN] positions, lo/hi [BM]: row i sees [lo_i, hi_i).
        MASKED False: a tile every row sees whole (the caller knows) -- the same values with
        the selects left out (they would all pick their first operand).  KEEP False: the caller
        knows every row it keeps sees at least one key of the tile, so the select that keeps a
        row's state where it sees none is left out (it would pick acc_new for every such row)."""
        sc, valid, smul, cmul = _scores(q, k, kpos, lo, hi, scale, softcap, SOFTCAP, MASKED)
        if not MASKED:
            return _tile_scored(sc, smul, cmul, v, m, l, acc, ones, ACC_DOT)
        m_new = tl.maximum(m, tl.max(sc, 1) * smul)
        alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
        p = tl.where(valid, _weights(sc, m_new, cmul), 0.0).to(v.dtype)
        l_new = l * alpha + tl.max(tl.dot(p, ones, input_precision="ieee"), 1)
        if ACC_DOT:
            acc_new = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        else:
            acc_new = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        if KEEP:
            # a row that sees no key of this tile keeps its state as it was, bit for bit (not
            # "times exp(0) plus zero products": what a chunk row does where a decode row never
            # goes)
            live = tl.max(valid.to(tl.int32), 1) > 0
            return (tl.where(live, m_new, m), tl.where(live, l_new, l),
                    tl.where(live[:, None], acc_new, acc))
        return m_new, l_new, acc_new

    @triton.jit
    def tile_first(q, k, v, kpos, lo, hi, ones, scale, softcap, SOFTCAP: tl.constexpr,
                   MASKED: tl.constexpr):
        """`tile_step` from the empty state (-inf, 0, 0) with ACC_DOT -- the first tile of a
        split -- without reading it: the same bits, two [BM, DP] passes fewer (the state's
        reset and its rescale).  Why equal: max(-inf, x) = x; l = 0 * alpha + s = s (alpha is 0
        or 1, s >= 0, never -0); the dot's accumulator 0 * alpha is the +0 a dot starts from.  A
        row that sees no key here gets m = -inf and p = 0, so l = +0; its acc is selected back
        to the empty +0 (p @ V would be NaN on an infinite V another row sees)."""
        sc, valid, smul, cmul = _scores(q, k, kpos, lo, hi, scale, softcap, SOFTCAP, MASKED)
        m_new = tl.max(sc, 1) * smul
        if MASKED:
            p = tl.where(valid, _weights(sc, m_new, cmul), 0.0).to(v.dtype)
        else:
            p = _weights(sc, m_new, cmul).to(v.dtype)
        l_new = tl.max(tl.dot(p, ones, input_precision="ieee"), 1)
        acc_new = tl.dot(p, v, input_precision="ieee")
        if MASKED:
            live = tl.max(valid.to(tl.int32), 1) > 0
            acc_new = tl.where(live[:, None], acc_new, 0.0)
        return m_new, l_new, acc_new

    @triton.jit
    def columns(c, D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                INTERLEAVED: tl.constexpr):
        """Memory dim of tile column c and whether it is a real one: the two rotation halves
        joined, each padded to BLOCK_H (D need not be a power of 2) -- the column order both
        kernels reduce head dims in."""
        if INTERLEAVED:
            dm = c
            cv = c < D
        else:
            dm = tl.where(c < BLOCK_H, c, c - BLOCK_H + HALF)
            cv = (c % BLOCK_H) < HALF
        return dm, cv

    @triton.jit
    def merge_one(M, L, A, m, l, a):
        """Fold a partial (m, l, a) into a running (M, L, A); an empty side (-inf) adds nothing."""
        M_new = tl.maximum(M, m)
        none = M_new == float("-inf")
        alpha = tl.where(none, 0.0, tl.exp(M - M_new))
        w = tl.where(none, 0.0, tl.exp(m - M_new))
        L2 = L * alpha + w * l
        A2 = A * alpha[:, None] + w[:, None] * a
        # exact by construction, not by exp(0) == 1: an empty partial (a split a chunk row does
        # not reach) leaves the total as it was; into an empty total a partial goes as it is
        # (so one group's total is the group's, whether or not a top-level merge runs)
        empty = m == float("-inf")
        fresh = M == float("-inf")
        return (tl.where(empty, M, tl.where(fresh, m, M_new)),
                tl.where(empty, L, tl.where(fresh, l, L2)),
                tl.where(empty[:, None], A, tl.where(fresh[:, None], a, A2)))

    @triton.jit
    def merge_live(M, L, A, m, l, a):
        """merge_one's values without its [BM, D] selects, for a caller whose running state
        starts at (-inf, -0.0, -0.0) and whose partials are never empty (a chunk's aligned row
        runs, triton_chunk.py).  Into that empty state a partial goes as it is: alpha =
        exp(-inf) = 0 and -0.0 * 0 = -0.0, w = 1 (selected, not exp(0)), and x + (-0.0) = x for
        every x, -0.0 included -- what merge_one's `fresh` select returns.  Otherwise the same
        expressions as merge_one ([BM] selects only)."""
        M_new = tl.maximum(M, m)
        none = M_new == float("-inf")
        alpha = tl.where(none, 0.0, tl.exp(M - M_new))
        w = tl.where(none, 0.0, tl.where(M == float("-inf"), 1.0, tl.exp(m - M_new)))
        return M_new, L * alpha + w * l, A * alpha[:, None] + w[:, None] * a

    @triton.jit
    def sink(SNK, heads, hm, M, L, A):
        """Join each head's sink logit to the merged softmax as one more key with no value:
        M' = max(M, sink), L' = L e^(M - M') + e^(sink - M'), A' = A e^(M - M')."""
        sk = tl.load(SNK + heads, mask=hm, other=float("-inf")).to(tl.float32)
        M_new = tl.maximum(M, sk)
        alpha = tl.exp(M - M_new)
        return M_new, L * alpha + tl.exp(sk - M_new), A * alpha[:, None]

    @triton.jit
    def plane_at(row, DT: tl.constexpr, D: tl.constexpr):
        """A plane-table row (k_ptr, v_ptr, row stride, head stride).  Where D % 8 == 0 the
        compiler is told what plane_row checked: 16-byte aligned storage, strides in whole
        16-byte units.  Without it a pointer read from memory is 2-byte aligned as far as
        Triton knows: a K/V tile loaded one element at a time, never pipelined; with it, 16-byte
        async copies, three tiles in flight (the same values: loads only)."""
        kp = tl.load(row).to(tl.pointer_type(DT))
        vp = tl.load(row + 1).to(tl.pointer_type(DT))
        rs = tl.load(row + 2)
        hs = tl.load(row + 3)
        if D % 8 == 0:
            kp = tl.multiple_of(kp, 16)
            vp = tl.multiple_of(vp, 16)
            rs = tl.multiple_of(rs, 8)
            hs = tl.multiple_of(hs, 8)
        return kp, vp, rs, hs

    return {"_tile_step": tile_step, "_tile_scored": tile_scored, "_tile_first": tile_first,
            "_merge_one": merge_one,
            "_merge_live": merge_live,
            "_sink": sink, "_columns": columns, "_plane_at": plane_at}
