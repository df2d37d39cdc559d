"""Chunk attention for a few rows: one program a split, the partials folded after (Triton).

Owns: `park_rows(lay)` (up to how many rows a chunk takes this route), `park_splits(...)` (how
many split programs a tile needs), `park_workspace(...)` and `fold_parked(...)` (the second
launch: every tile's parked split partials folded in order).  Does not own: the split body
(triton_chunk.py's chunk_kernel with PARK -- the nested loop's, instruction for instruction),
the merge arithmetic (triton_attn.py).

Why: a verification block of 1-16 rows is one query tile, and chunk_kernel walks that tile's
splits one after another in one program -- on the 1B at 2k, 26 layers of one CTA each: 4.5 ms
of chunk attention in a 6 ms block against 1.3 ms for a whole decode step (H200, tenth session,
benchmarks/host_profile.py).  The decode step spreads the same splits over programs and folds
their partials; so does this:

    launch 1  grid (tiles, KV, nsp)   program s: split a = a0 + s of its tile, from empty ->
                                      (m, l, acc) parked at slot s           (a0 = lo_min // SPLIT)
    launch 2  grid (tiles, KV)        for a in a0 .. a_hi:  group <- merge_one(group, parked)
                                      at a group's last split or a_hi:
                                          total <- merge_one(total, group)

Why the bits are chunk_kernel's (and so the decode step's): a split's partial is computed by
the same tile loop from the same empty state; float32 partials round-trip memory exactly; the
fold runs the nested loop's merge_one sequence in its order.  tests/cuda/test_triton_chunk.py
holds both routes equal to the decode kernel.
"""
from __future__ import annotations

import functools

import torch

from .triton_attn import pieces
from .triton_chunk_tiles import chunk_pieces
from .triton_pieces import _pow2


def park_rows(lay: dict) -> int:
    """Chunks of up to this many rows take the split-parallel route (0: never)."""
    return int(lay.get("park", 0)) if int(lay.get("dsplit", 1)) == 1 else 0


def park_splits(rows: int, split: int, window: int | None, positions: int) -> int:
    """Split programs a tile of `rows` query rows needs, for positions below `positions`: its
    keys run from the first row's window start to the last row -- at most window + rows - 1
    positions (all `positions` without a window), one split more when they start mid-split."""
    span = positions if not window else min(positions, window + rows - 1)
    return -(-span // split) + 1


PARK_BYTES = 64 << 20     # the most workspace a layer's parked partials may take


def park_workspace(device, slots: int, dp: int):
    """(m, l, acc) float32 [slots], [slots], [slots, dp] for one layer's launch pair, or None
    past PARK_BYTES.  Fresh each call: eagerly the caching allocator hands back the last
    layer's (stream-ordered); in a capture the graph's pool keeps them for its replays."""
    if slots * (dp + 2) * 4 > PARK_BYTES:
        return None
    f32 = dict(dtype=torch.float32, device=device)
    return torch.empty(slots, **f32), torch.empty(slots, **f32), torch.empty(slots, dp, **f32)


@functools.lru_cache(maxsize=None)
def _fold_kernel():
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals
    globals().update(pieces())
    globals().update(chunk_pieces())

    @triton.jit(do_not_specialize=["start", "R", "window", "nsp"])
    def fold_kernel(O, SNK, META, MS, LS, ACC, start, R, window, nsp,
                    H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                    HALF: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr,
                    BM: tl.constexpr, ROWS: tl.constexpr, SPLIT: tl.constexpr,
                    GS: tl.constexpr, SINKS: tl.constexpr, DEV: tl.constexpr):
        if DEV:                                   # a captured pass: (start, rows) on the device
            start = tl.load(META)
            R = tl.load(META + 1)
        t = tl.program_id(0)
        kvh = tl.program_id(1)
        # the tile's slots and splits as chunk_kernel lays them out (the same lines: the same
        # binary as the one measured; as a shared helper they compile in another order)
        i = tl.arange(0, BM)
        r = t * ROWS + i // G
        hg = i % G
        rv = (i < ROWS * G) & (r < R)
        DP: tl.constexpr = 2 * BLOCK_H
        c = tl.arange(0, DP)
        dm, cv = _columns(c, D, HALF, BLOCK_H, INTERLEAVED)
        r_end = tl.minimum(t * ROWS + ROWS, R)
        p_min = start + t * ROWS
        p_max = start + r_end - 1
        lo_min = tl.where(window > 0, tl.maximum(p_min - window + 1, 0), 0)
        a_hi = p_max // SPLIT
        a0 = lo_min // SPLIT
        Mt = tl.full([BM], float("-inf"), tl.float32)
        Lt = tl.zeros([BM], tl.float32)
        At = tl.zeros([BM, DP], tl.float32)
        Mg = tl.full([BM], float("-inf"), tl.float32)
        Lg = tl.zeros([BM], tl.float32)
        Ag = tl.zeros([BM, DP], tl.float32)
        for a in range(a0, a_hi + 1):
            slot = ((t * KV + kvh) * nsp + (a - a0)).to(tl.int64) * BM + i
            m = tl.load(MS + slot)
            l = tl.load(LS + slot)
            acc = tl.load(ACC + slot[:, None] * DP + c[None, :])
            Mg, Lg, Ag, Mt, Lt, At = _split_done(a, a_hi, m, l, acc, Mg, Lg, Ag, Mt, Lt, At, BM,
                                                 DP, GS)
        heads = kvh * G + hg
        if SINKS:
            Mt, Lt, At = _sink(SNK, heads, rv, Mt, Lt, At)
        tl.store(O + (r.to(tl.int64) * H + heads)[:, None] * D + dm[None, :],
                 (At / Lt[:, None]).to(O.dtype.element_ty), mask=rv[:, None] & cv[None, :])

    return fold_kernel


def fold_parked(out: torch.Tensor, kv: int, sinks, meta, ws, start: int, R: int,
                window: int | None, nsp: int, tiles: int, rows: int, bm: int, interleaved: bool,
                lay: dict, warps: int) -> None:
    """Launch 2: every (tile, KV head)'s parked partials into out [R, H, D] (`meta`: a captured
    pass's META, whose (start, rows) replace the args)."""
    _, H, D = out.shape
    ms, ls, acc = ws
    _fold_kernel()[(tiles, kv)](
        out, sinks if sinks is not None else ms, meta if meta is not None else ms, ms, ls, acc,
        int(start), int(R), int(window or 0), int(nsp),
        H=H, KV=kv, G=H // kv, D=D, HALF=D // 2, BLOCK_H=_pow2(D // 2, 8),
        INTERLEAVED=bool(interleaved), BM=bm, ROWS=rows, SPLIT=lay["split"], GS=lay["group"],
        SINKS=sinks is not None, DEV=meta is not None, num_warps=warps, enable_fp_fusion=False)
