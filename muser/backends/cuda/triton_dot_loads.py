"""How a dot_rows program reads its weights, apart from the plain tile (Triton pieces).

Owns: `load_pieces()` -> `_weights_tile` (the weight tile a dot takes: 16-bit weights as
stored, int8 rows converted, or a tile of BlockInt8 weights -- GGUF's Q8_0 blocks,
quant="int8-head" -- dequantized to the activation dtype), by the name triton_dot.py's kernels
call it, and the fence that keeps an int8 tile's MMA layout the bf16 tile's (below).  Does not
own: the kernels that call it, their tiles (triton_dot.py, triton_dot_tiles.py), the weights'
layout (weights_int8.py).
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def load_pieces() -> dict:
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals

    @triton.jit
    def layout_fence(w):
        """w itself, through a `mov` (two 16-bit values a register) that Triton cannot see
        through.  Why: Triton lays out a dot operand computed from an 8-bit load four k a lane
        (TTGIR `kWidth = 4`) instead of a 16-bit operand's two, which permutes the k inside
        each m16n8k16 MMA of a decode tile -- for x and the weights alike, the same sum in exact
        arithmetic, but the tensor core's own rounding can then differ: from the bf16 tile (the
        embedded 270M's int8-head logits: 28 of 262,144 at one row, thirty-seventh session) and
        from the chunk tiles' wgmma, which reads its weights from shared memory in one layout
        (for int8 rows not seen at a layer's size on the H200, thirty-eighth session -- the
        layouts differ all the same, so the fence keeps them equal by construction).  Behind
        the fence the operand's layout is chosen from the 16-bit value alone: the bf16 tile's.
        Not under the interpreter (no inline asm there; its dot is numpy's either way)."""
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=w.dtype,
                                         is_pure=False, pack=2)

    globals()["_layout_fence"] = layout_fence

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
            w = tl.reshape(tl.reshape(q, (BLOCK_N, BLOCK_K // 32, 32)) * s[:, :, None],
                           (BLOCK_N, BLOCK_K)).to(DT)
        else:
            ks = ks0 + tl.arange(0, BLOCK_K)
            sp = S + rows[:, None].to(tl.int64) * (K // 32) + ks[None, :] // 32
            w = (q * tl.load(sp, mask=m2, other=0.0).to(tl.float32)).to(DT)
        return w

    globals()["_block_weights"] = block_weights

    @triton.jit
    def weights_tile(wp, S, rows, cmask, ks0, m2, K: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, DT: tl.constexpr, WQB: tl.constexpr,
                     FENCE: tl.constexpr):
        """The [BLOCK_N, BLOCK_K] weight tile a dot takes, in the activation dtype DT: BlockInt8
        dequantized (WQB), else the weights as stored -- 16-bit ones as they are, int8 rows
        (quant="int8") converted, exact for |q| <= 127, their scale applied to the finished
        sum.  FENCE (int8 of either kind, on a GPU): behind `_layout_fence`, so a decode tile's
        MMA sums k in the order the chunk tiles' (wgmma) and the bf16 tiles' do."""
        if WQB:
            w = _block_weights(wp, S, rows, cmask, ks0, m2, K, BLOCK_N, BLOCK_K, DT)
        else:
            w = tl.load(wp, mask=m2, other=0).to(DT)
        if FENCE:
            w = _layout_fence(w)
        return w

    return {"_weights_tile": weights_tile}
