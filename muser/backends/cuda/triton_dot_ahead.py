"""A small decode projection whose weights are asked for before the PDL wait (MUSER_DOT_AHEAD).

Owns: `dot_ahead(x, w, glu, gelu, pdl)` and `ahead_takes(...)` -- the decode tile of
`triton_dot.dot_rows` for projections small enough that a program holds its whole weight slab
in registers: the slab is loaded *before* `griddepcontrol.wait` (the weights do not depend on
the launch before), x after it, then the same k16 MMA chain.  Does not own: the tile tables
(triton_dot_tiles.py), the epilogue (triton_dot_epilogue.py), the choice to use it
(decode_step.DecodeStep._dot).

Why (benchmarks/NOTES.md, forty-second session; H100): a dependent stage costs ~1.2 us however
it is waited for, and asking for a stage's weights before the wait took a 2 MB stage from 2.20
to 1.67 us (tree reduction) and from 3.60 to 2.35 us (k16 MMA chain) -- also right after a real
270M gate|up launch (6.32 -> 5.71 us a pair), not after the 4B's (the bus is busy there).

Why the same bits as dot_rows: an output's sum there is its k16 MMA steps in order from zero,
whatever the K step (`piece_dot`); here the keys are cut into parts of KC and each part is one
tl.dot chained onto the accumulator -- the same k16 steps in the same order, both operands
16-bit (MMA operand layout kWidth 2, as every decode tile's: tests/cuda/test_mma_layouts.py).
No split-K pieces, no int8 weights, no bias, no widened or picking head: `ahead_takes` says
which calls qualify.

    keys   0 .. KC-1 | KC .. 2KC-1 | ... | K-KC .. K-1     x [BM, KC] a part, after the wait
    slab   w0        | w1          | ... | w(NC-1)         before it (GLU: u0.. the up rows)

(A part a name, not one [BLOCK_N, K] tensor in one dot: x's MMA fragments for all of K at
once took 216-255 registers and spilled; a part at a time, x's fragments are a part's.)
"""
from __future__ import annotations

import functools

import torch

from .triton_dot_epilogue import act_pieces
from . import triton_dot_loads
from .triton_dot_tiles import dot_config
from .triton_pieces import pdl_launch, pdl_pieces

BLOCK_N = 32            # output columns a program (4 warps: an n8 MMA tile each), x K (x 2: GLU)
SLAB = 40960            # most weights a program holds (80 KB bf16: 160 B a thread)
KC = 128                # keys a part of the slab
MAX_PARTS = 9           # parts the kernel names (K <= 1,152: the 1B's qkv)


def ahead_takes(n: int, k: int, glu: bool, rows: int, w: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether dot_ahead computes this call with dot_rows' bits: a decode tile (<= 16 rows),
    16-bit weights of the activation dtype, no split-K pieces, the slab within SLAB, K in at
    most MAX_PARTS parts of KC keys."""
    # GLU: the gate and up slabs behind the fence spilled 3.4 KB a thread (sm_90): not taken
    return (not glu and rows <= 16 and w.dtype == dtype and dtype in (torch.bfloat16, torch.float16)
            and dot_config(n, k, glu)[4] == 0 and BLOCK_N * k * (2 if glu else 1) <= SLAB
            and k % KC == 0 and k // KC <= MAX_PARTS)


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    globals()["tl"] = tl
    globals().update(act_pieces())
    globals().update(pdl_pieces())
    triton_dot_loads.load_pieces()          # defines the fence in its module
    globals().update(_layout_fence=triton_dot_loads._layout_fence)

    @triton.jit
    def part(W, cols, cmask, N, i: tl.constexpr, K: tl.constexpr, KC: tl.constexpr,
             GLU: tl.constexpr):
        """Keys [i KC, (i + 1) KC) of the program's weight rows, [BLOCK_N, KC] (rows past N read
        as zeros, never stored), and of their up rows (GLU; else the same tile again)."""
        p = W + cols[:, None].to(tl.int64) * K + i * KC + tl.arange(0, KC)[None, :]
        w = tl.load(p, mask=cmask[:, None], other=0.0)
        u = w
        if GLU:
            u = tl.load(p + N * K, mask=cmask[:, None], other=0.0)
        return w, u

    @triton.jit
    def xpart(X, rm, rmask, i: tl.constexpr, K: tl.constexpr, KC: tl.constexpr):
        """x's keys [i KC, (i + 1) KC), [BM, KC] (after the wait)."""
        return tl.load(X + rm[:, None].to(tl.int64) * K + i * KC + tl.arange(0, KC)[None, :],
                       mask=rmask[:, None], other=0.0)

    @triton.jit
    def step(x, w, u, acc, accu, GLU: tl.constexpr, FENCE: tl.constexpr):
        """One part's k16 MMA steps chained onto the accumulators.  FENCE (a GPU): the weights
        pass `_layout_fence` here, after the wait -- else Triton moves each part's conversion
        to the MMA layout (a shared-memory round trip and a CTA barrier) up to its load, and
        the parts' loads run one after another before the wait (5 DRAM trips for 640 keys)."""
        if FENCE:
            w = _layout_fence(w)
            if GLU:
                u = _layout_fence(u)
        acc = tl.dot(x, tl.trans(w), acc)
        if GLU:
            accu = tl.dot(x, tl.trans(u), accu)
        return acc, accu

    globals().update(_part=part, _xpart=xpart, _step=step)

    @triton.jit
    def dot_ahead_kernel(X, W, Y, B, N, K: tl.constexpr, KC: tl.constexpr, NC: tl.constexpr,
                         BLOCK_N: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr,
                         BM: tl.constexpr, PDL: tl.constexpr, FENCE: tl.constexpr = False):
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        rmask = rm < B
        # The slab first, in NC parts of KC keys (Triton cannot slice a register tensor, so one
        # name a part, up to MAX_PARTS): constant weights, read while the launch before runs.
        w0, u0 = _part(W, cols, cmask, N, 0, K, KC, GLU)
        if NC > 1:
            w1, u1 = _part(W, cols, cmask, N, 1, K, KC, GLU)
        if NC > 2:
            w2, u2 = _part(W, cols, cmask, N, 2, K, KC, GLU)
        if NC > 3:
            w3, u3 = _part(W, cols, cmask, N, 3, K, KC, GLU)
        if NC > 4:
            w4, u4 = _part(W, cols, cmask, N, 4, K, KC, GLU)
        if NC > 5:
            w5, u5 = _part(W, cols, cmask, N, 5, K, KC, GLU)
        if NC > 6:
            w6, u6 = _part(W, cols, cmask, N, 6, K, KC, GLU)
        if NC > 7:
            w7, u7 = _part(W, cols, cmask, N, 7, K, KC, GLU)
        if NC > 8:
            w8, u8 = _part(W, cols, cmask, N, 8, K, KC, GLU)
        _pdl_begin(PDL)                     # PDL: now wait for the kernel before
        # every part of x asked for at once, then the parts' MMA steps in key order
        x0 = _xpart(X, rm, rmask, 0, K, KC)
        if NC > 1:
            x1 = _xpart(X, rm, rmask, 1, K, KC)
        if NC > 2:
            x2 = _xpart(X, rm, rmask, 2, K, KC)
        if NC > 3:
            x3 = _xpart(X, rm, rmask, 3, K, KC)
        if NC > 4:
            x4 = _xpart(X, rm, rmask, 4, K, KC)
        if NC > 5:
            x5 = _xpart(X, rm, rmask, 5, K, KC)
        if NC > 6:
            x6 = _xpart(X, rm, rmask, 6, K, KC)
        if NC > 7:
            x7 = _xpart(X, rm, rmask, 7, K, KC)
        if NC > 8:
            x8 = _xpart(X, rm, rmask, 8, K, KC)
        acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
        accu = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
        acc, accu = _step(x0, w0, u0, acc, accu, GLU, FENCE)
        if NC > 1:
            acc, accu = _step(x1, w1, u1, acc, accu, GLU, FENCE)
        if NC > 2:
            acc, accu = _step(x2, w2, u2, acc, accu, GLU, FENCE)
        if NC > 3:
            acc, accu = _step(x3, w3, u3, acc, accu, GLU, FENCE)
        if NC > 4:
            acc, accu = _step(x4, w4, u4, acc, accu, GLU, FENCE)
        if NC > 5:
            acc, accu = _step(x5, w5, u5, acc, accu, GLU, FENCE)
        if NC > 6:
            acc, accu = _step(x6, w6, u6, acc, accu, GLU, FENCE)
        if NC > 7:
            acc, accu = _step(x7, w7, u7, acc, accu, GLU, FENCE)
        if NC > 8:
            acc, accu = _step(x8, w8, u8, acc, accu, GLU, FENCE)
        if not GLU:
            accu = acc                      # (no up half: a stand-in the epilogue never reads)
        y = _finish(acc, accu, 1.0, 1.0, 0.0, False, False, GLU, GELU, X.dtype.element_ty)
        tl.store(Y + rm[:, None].to(tl.int64) * N + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=rmask[:, None] & cmask[None, :])

    return dot_ahead_kernel


def dot_ahead(x: torch.Tensor, w: torch.Tensor, glu: bool = False, gelu: bool = False,
              pdl: bool = False, warps: int = 4) -> torch.Tensor:
    """x [B, K] @ w.T (GLU: act(x @ gate.T) * (x @ up.T), w = [gate; up]) -> [B, N] in x's dtype,
    bitwise dot_rows' result for the calls `ahead_takes` accepts (checked here: a refused call
    raises rather than compute other bits)."""
    import triton
    n, k = w.shape
    if glu:
        n //= 2
    B = x.shape[0]
    if not ahead_takes(n, k, glu, B, w, x.dtype):
        raise ValueError(f"dot_ahead takes decode tiles of 16-bit weights without split-K pieces "
                         f"and with a slab of at most {SLAB} weights in parts of {KC} keys, got [{n}, {k}] "
                         f"(glu {glu}), {B} rows, {w.dtype} weights for {x.dtype} rows")
    x = x.contiguous()
    out = x.new_empty(B, n)
    _kernel()[(triton.cdiv(n, BLOCK_N), triton.cdiv(B, 16))](
        x, w, out, B, n, K=k, KC=KC, NC=k // KC, BLOCK_N=BLOCK_N, GLU=glu, GELU=gelu, BM=16,
        FENCE=w.is_cuda,                    # inline asm: not under the interpreter
        num_warps=warps, num_stages=1, **pdl_launch(pdl))
    return out
