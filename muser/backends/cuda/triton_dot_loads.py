"""How a dot_rows program reads its weights, apart from the plain tile (Triton pieces, host rule).

Owns: `load_pieces()` -> `_block_weights` (a tile of BlockInt8 weights -- GGUF's Q8_0 blocks,
quant="int8-head" -- dequantized to the activation dtype before the dot) and `_prefetch_rows`
(MUSER_DOT_EARLY: the program's own weight rows asked of the L2 before its PDL wait, one
`cp.async.bulk.prefetch.L2` a row), by the names triton_dot.py's kernels call them; and
`early_fits`, where that prefetch may run.  Does not own: the kernels that call them, their
tiles (triton_dot.py, triton_dot_tiles.py), the weights' layout (weights_int8.py).
"""
from __future__ import annotations

import functools

from .l2_prefetch import prefetch_pieces


def early_fits(ptr: int, k: int, eb: int, ks: int, bn: int, glu: bool, warps: int) -> bool:
    """Whether dot_rows' programs can ask the L2 for their weight rows (`early`): a weight at
    `ptr` of `k` keys of `eb` bytes whose every row slice of `ks` keys starts and ends 16-byte
    aligned (the bulk prefetch's unit), and a lane a row -- bn rows (2 bn with the up half)
    within 32 x warps lanes."""
    return ptr % 16 == 0 and (k * eb) % 16 == 0 and (ks * eb) % 16 == 0 and \
        bn * (2 if glu else 1) <= 32 * warps


@functools.lru_cache(maxsize=None)
def load_pieces() -> dict:
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals
    globals()["_bulk_prefetch"] = prefetch_pieces()["_bulk_prefetch"]

    @triton.jit
    def block_weights(wp, S, rows, cmask, ks0, m2, K: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, DT: tl.constexpr):
        """A [BLOCK_N, BLOCK_K] tile of BlockInt8 weights (weights_int8.py) from key ks0 on, as
        the dot takes them: each int8 weight times its block's float16 scale in float32 (exact),
        rounded once to DT.  A step of whole 32-key blocks reads its [BLOCK_N, BLOCK_K / 32]
        scales once and spreads them over the blocks (ks0 is a multiple of 32 there: the K steps
        and pieces are); a shorter step reads a scale an element -- the same products."""
        q = tl.load(wp, mask=m2, other=0).to(tl.float32)
        if BLOCK_K % 32 == 0:
            kb = ks0 // 32 + tl.arange(0, BLOCK_K // 32)
            s = tl.load(S + rows[:, None].to(tl.int64) * (K // 32) + kb[None, :],
                        mask=cmask[:, None] & (kb < K // 32)[None, :], other=0.0).to(tl.float32)
            w = tl.reshape(q, (BLOCK_N, BLOCK_K // 32, 32)) * s[:, :, None]
            return tl.reshape(w, (BLOCK_N, BLOCK_K)).to(DT)
        else:
            ks = ks0 + tl.arange(0, BLOCK_K)
            sp = S + rows[:, None].to(tl.int64) * (K // 32) + ks[None, :] // 32
            return (q * tl.load(sp, mask=m2, other=0.0).to(tl.float32)).to(DT)

    @triton.jit
    def prefetch_rows(W, N, K: tl.constexpr, KS: tl.constexpr, BLOCK_N: tl.constexpr,
                      GLU: tl.constexpr, EB: tl.constexpr, LANES: tl.constexpr):
        """This program's weight rows -- its BLOCK_N columns' (and up columns') keys of its
        piece -- asked of the L2, one `cp.async.bulk.prefetch.L2` a row (nothing comes back
        to the SM; l2_prefetch.py): lane i < BLOCK_N takes column i, the next BLOCK_N lanes
        (GLU) its up row.  The host checks the 16-byte alignment of every row's start and size."""
        lane = tl.arange(0, LANES)
        col = tl.program_id(0) * BLOCK_N + lane % BLOCK_N
        row = col + (lane // BLOCK_N) * N
        k_lo = tl.program_id(2) * KS
        ok = (col < N) & (lane < BLOCK_N * (1 + GLU)) & (k_lo < K)
        addr = (W + row.to(tl.int64) * K + k_lo).to(tl.int64, bitcast=True)
        size = tl.where(ok, tl.minimum(KS, K - k_lo) * EB, 0).to(tl.int32)
        _bulk_prefetch(addr, size)

    return {"_block_weights": block_weights, "_prefetch_rows": prefetch_rows}
