"""Chunk attention over a growing plane with one accumulator in registers (Triton; experiment).

Owns: `lean_attention(q, keys, values, start, first, scale, softcap, interleaved, lay, ...)` --
the nested loop of triton_chunk.py's chunk_kernel (the same split partials, the same merge_one
sequence, so the decode step's bits), with the merge group's and the total's (M, L, A) kept in
a float32 workspace instead of registers.  Does not own: the split body (`_split_partial`,
triton_chunk_tiles.py), the merge (`_merge_one`, triton_attn.py), rings, sinks, captured passes.

Why (benchmarks/fa_ceiling.py, H200, 1B global layer, 16k rows): a plain Triton flash attention
over the same 32-key tiles takes 1.33 ms at 4 warps and 3.08 at 8; chunk_kernel takes 6.76 --
it needs 8 warps because three [64, 256] float32 accumulators (split, group, total) do not fit
4 warps' registers.  The group and the total change once a split (4 tiles) and once a group
(64 tiles): read-modify-write through memory there costs ~64 KB a split of L2 traffic a program,
and leaves the split's accumulator and q in registers, as in flash attention.

    for a in splits of the tile:                       q reloaded (not live across the merge)
        (m, l, acc) = _split_partial(a)                registers
        G = (m, l, acc) if a opens its group else merge_one(load G, (m, l, acc))
        at a group's end:  T = G if it is the first group else merge_one(load T, G); store T
        else:              store G
    out = T.A / T.L

`merge_one(empty, x)` returns x as it is (triton_attn.py), so assigning where the loop would
merge into an empty state is the same value.  float32 round-trips memory exactly.
"""
from __future__ import annotations

import functools

import torch

from .triton_attn import pieces
from .triton_chunk_tiles import chunk_pieces
from .triton_ops import _pow2


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    globals().update(pieces())
    globals().update(chunk_pieces())

    @triton.jit(do_not_specialize=["start", "R", "first", "kcount"])
    def lean_kernel(Q, K, V, O, WM, WL, WA, start, R, first, kcount, rs, hs, scale, softcap,
                    H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
                    BM: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                    SPLIT: tl.constexpr, GS: tl.constexpr, SOFTCAP: tl.constexpr,
                    INTERIOR: tl.constexpr, ACC_DOT: tl.constexpr):
        t = tl.program_id(0)
        kvh = tl.program_id(1)
        i = tl.arange(0, BM)
        r = t * ROWS + i // G                    # query row of slot i
        hg = i % G
        rv = (i < ROWS * G) & (r < R)
        DPW: tl.constexpr = 2 * BLOCK_H
        dm, cv = _columns(tl.arange(0, DPW), D, HALF, BLOCK_H, INTERLEAVED)
        p = start + r
        lo = tl.zeros([BM], tl.int32) + 0 * p    # a growing plane: every row from position 0
        hi = tl.where(rv, p + 1, lo)
        heads = kvh * G + hg
        qoff = (r.to(tl.int64) * H + heads)[:, None] * D + dm[None, :]
        r_end = tl.minimum(t * ROWS + ROWS, R)
        p_min = start + t * ROWS
        p_max = start + r_end - 1
        lo_min = p_min * 0
        a_hi = p_max // SPLIT
        ones = tl.full([BLOCK_N, 16], 1.0, O.dtype.element_ty)
        f0 = lo_min
        f1 = (p_min + 1) // BLOCK_N * BLOCK_N
        slot = (t * KV + kvh).to(tl.int64) * BM + i                  # [BM] this program's rows
        wa = slot[:, None] * DPW + tl.arange(0, DPW)[None, :]       # [BM, DPW]
        tot = KV * tl.num_programs(0) * BM                           # total's rows after groups'
        for a in range(0, a_hi + 1):
            q = tl.load(Q + qoff, mask=rv[:, None] & cv[None, :], other=0.0)
            m, l, acc = _split_partial(a, 0, p_max, f0, f1, K, V, first, 0, 0, kcount, lo_min,
                                       rs, hs, kvh, dm, cv, dm, cv, q, lo, hi, ones, scale,
                                       softcap, K, V, start, BM, DPW, BLOCK_N, SPLIT, SOFTCAP,
                                       False, INTERIOR, ACC_DOT, False, KV, D)
            if a % GS != 0:                      # the group so far, then this split into it
                m, l, acc = _merge_one(tl.load(WM + slot), tl.load(WL + slot), tl.load(WA + wa),
                                       m, l, acc)
            if (a % GS == GS - 1) | (a == a_hi):
                if a >= GS:                      # the total so far, then the group into it
                    m, l, acc = _merge_one(tl.load(WM + tot + slot), tl.load(WL + tot + slot),
                                           tl.load(WA + tot * DPW + wa), m, l, acc)
                if a < a_hi:
                    tl.store(WM + tot + slot, m)
                    tl.store(WL + tot + slot, l)
                    tl.store(WA + tot * DPW + wa, acc)
                else:                            # the last split: (m, l, acc) is the total
                    tl.store(O + qoff, (acc / l[:, None]).to(O.dtype.element_ty),
                             mask=rv[:, None] & cv[None, :])
            else:
                tl.store(WM + slot, m)
                tl.store(WL + slot, l)
                tl.store(WA + wa, acc)

    return lean_kernel


def lean_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
                   first: int, scale: float, softcap: float | None, interleaved: bool,
                   lay: dict, block_m: int = 64, warps: int = 4,
                   kcount: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """q [R, H, D] at positions start.. over an ordered growing view keys/values [S, KV, D]
    (key position x at row x - first) -> [R, H, D], each row with the decode step's bits
    (`lay`: the layer's triton_attn.layout; the split loop is the nested one)."""
    R, H, D = q.shape
    KV = keys.shape[1]
    G = H // KV
    if keys.stride() != values.stride() or keys.stride(-1) != 1:
        raise ValueError(f"keys/values views must share strides with unit last stride, "
                         f"got {tuple(keys.stride())} and {tuple(values.stride())}")
    q = q.contiguous()
    out = out if out is not None else torch.empty_like(q)
    if R == 0:
        return out
    half = D // 2
    rows = max(1, block_m // G)
    bm = max(16, _pow2(rows * G))
    tiles = -(-R // rows)
    dp = 2 * _pow2(half, 8)
    f32 = dict(dtype=torch.float32, device=q.device)
    n = tiles * KV * bm                          # group rows, then total rows
    wm, wl, wa = (torch.empty(2 * n, **f32), torch.empty(2 * n, **f32),
                  torch.empty(2 * n, dp, **f32))
    _kernel()[(tiles, KV)](
        q, keys, values, out, wm, wl, wa, int(start), R, int(first),
        int(kcount if kcount is not None else keys.shape[0]), keys.stride(0), keys.stride(1),
        float(scale), float(softcap or 1.0),
        H=H, KV=KV, G=G, D=D, HALF=half, BLOCK_H=_pow2(half, 8), INTERLEAVED=bool(interleaved),
        BM=bm, ROWS=rows, BLOCK_N=lay["block_n"], SPLIT=lay["split"], GS=lay["group"],
        SOFTCAP=softcap is not None, INTERIOR=bool(lay.get("interior", True)),
        ACC_DOT=bool(lay.get("acc_dot", False)), num_warps=warps, enable_fp_fusion=False)
    return out
