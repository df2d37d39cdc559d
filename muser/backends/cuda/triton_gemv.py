"""The batch-1 GEMV on CUDA (Triton), MUSER_GEMV=fast: a latency-bound kernel for 1..B rows.

Owns: `gemv` (each program loads its whole [rows, K] weight tile once and serves every row with
the same float32 reduction: row-invariant, ~10% faster than dot_rows at batch 1 on the H200 in
the sweep that chose it), its tile table `GEMV_TILES` and `gemv_config`.  Does not own: the
default projections (triton_dot.py's `dot_rows`, whose act * up it shares), when it is used
(decode_step.py).  Triton is imported lazily: this module imports on a machine without it.
"""
from __future__ import annotations

import functools

import torch

from .triton_dot_epilogue import act_pieces
from .triton_pieces import _pow2


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    globals()["tl"] = tl
    globals().update(act_pieces())      # module globals: the interpreter resolves names there

    @triton.jit
    def gemv_kernel(X, W, BIAS, Y, B, N, K: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr,
                    HAS_BIAS: tl.constexpr):
        # The whole [BLOCK_N, K] tile is loaded once (K padded to a power of 2, masked): every
        # load of a program is in flight together -- a few-row GEMV is latency-bound.  Then the
        # tile serves each of the B rows in turn with the SAME reduction (one tl.sum over the
        # same layout): row b's bits do not depend on B -- a session decoded in a batch equals
        # the session decoded alone ("one arithmetic per token", docs/exactness.md).
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        ks = tl.arange(0, BLOCK_K)
        kmask = ks < K
        m2 = rmask[:, None] & kmask[None, :]
        wp = W + rows[:, None].to(tl.int64) * K + ks[None, :]
        w = tl.load(wp, mask=m2, other=0.0)
        if GLU:
            wu = tl.load(wp + N * K, mask=m2, other=0.0)        # the up row of each gate row
        if HAS_BIAS:
            bias = tl.load(BIAS + rows, mask=rmask, other=0.0).to(tl.float32)
        for b in range(B):
            xv = tl.load(X + b * K + ks, mask=kmask, other=0.0)
            x = xv.to(tl.float32)
            y = tl.sum(w.to(tl.float32) * x[None, :], 1)
            if HAS_BIAS:
                y = y + bias
            if GLU:
                y = _act_up(y, tl.sum(wu.to(tl.float32) * x[None, :], 1), X.dtype.element_ty, GELU)
            tl.store(Y + tl.cast(b, tl.int64) * N + rows, y.to(Y.dtype.element_ty), mask=rmask)

    return gemv_kernel


# (n, k, glu) -> (rows per program, warps), the fastest of a sweep on an H200 (2026-12,
# benchmarks/cuda_kernels.py; benchmarks/NOTES.md, CUDA): Gemma-3-1B and -4B decode shapes.
GEMV_TILES = {
    (1536, 1152, False): (2, 8), (1152, 1024, False): (2, 8), (6912, 1152, True): (1, 2),
    (1152, 6912, False): (2, 8), (4096, 2560, False): (1, 4), (2560, 2048, False): (2, 4),
    (10240, 2560, True): (1, 2), (2560, 10240, False): (2, 4),
}


def gemv_config(n: int, k: int, glu: bool = False) -> tuple[int, int]:
    """(rows per program, warps) for an [n, k] product: the measured table, else the shape of
    its winners -- 1-2 rows of K per program, and at least ~2 programs per multiprocessor."""
    hit = GEMV_TILES.get((n, k, glu))
    if hit:
        return hit
    kp = _pow2(k)
    if glu:
        block_n, warps = 1, (2 if kp <= 4096 else 4)
    elif kp <= 2048:
        block_n, warps = 2, 8
    elif kp <= 4096:
        block_n, warps = 1, 4
    else:
        block_n, warps = 2 if kp <= 16384 else 1, 4 if kp <= 16384 else 8
    while block_n > 1 and -(-n // block_n) < 264:
        block_n //= 2
    return block_n, warps


def gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, glu: bool = False,
         gelu: bool = False, block_n: int | None = None, warps: int | None = None,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, K] @ w[N, K].T (+ bias) -> [B, N] for B decode rows; with glu, w is gate|up [2I, K]
    and the result act(x @ gate.T) * (x @ up.T) [B, I] (act_mul fused in).  Each program loads
    its whole [rows, K] tile once (many loads in flight: the few-row product is latency-bound)
    and reuses it for every row.  The launch configuration depends on (N, K) only and every row
    takes the same float32 reduction: row b of a B-row call is bitwise the 1-row call on it."""
    if w.dtype == torch.int8:
        raise ValueError("gemv takes float weights; int8 ones go through dot_rows")
    kern = _kernel()
    n, k = w.shape
    if glu:
        n //= 2
    x = x.contiguous()
    B = x.shape[0]
    bn, nw = gemv_config(n, k, glu)
    bn, nw = block_n or bn, warps or nw
    out = out if out is not None else x.new_empty(B, n)
    kern[(-(-n // bn),)](x, w, bias if bias is not None else w, out, B, n, K=k, BLOCK_N=bn,
                         BLOCK_K=_pow2(k), GLU=glu, GELU=gelu, HAS_BIAS=bias is not None,
                         num_warps=nw)
    return out
