"""`dot_rows`' wide chunk tiles with their tiles loaded by TMA (Triton tensor descriptors).

Owns: `tma_fits` (when a dot_rows call may take this route) and `dot_tma` (the launch).  Does
not own: the arithmetic -- it is dot_rows' (triton_dot.py): the same split-K pieces, each from
zero, summed in order, each tl.dot chaining its k16 MMA steps onto its accumulator, and the
one epilogue `_finish`.  What changes is only how a tile reaches shared memory: one bulk copy
(TMA) a [BM, BK] / [BN, BK] tile instead of masked pointer loads, with out-of-range rows and
keys filled with zeros -- the masked loads' `other=0` -- so a row's sums are the same
instruction sequence on the same values (torch.equal against the decode tiles:
tests/cuda/test_triton_ops.py).  Programs go in groups of GROUP_M row tiles a column sweep, so
a weight tile is read from HBM once for GROUP_M row tiles (the L2 keeps it).

    K:   |<- piece 0 (KS) ->|<- piece 1 ->| ... |<- last piece, K - p*KS, zero-filled to KS ->|
         |BK|BK|BK| ...     |                         (TMA: keys >= K read as 0, as other=0)

MUSER_DOT_TMA (on|off): bf16/f16 weights, 128-row tiles (>= WIDE_ROWS rows), no int8 scales,
no picks.  Triton is imported lazily.
"""
from __future__ import annotations

import functools

import torch

from .triton_pieces import pdl_launch, pdl_pieces

GROUP_M = 8      # row tiles that share a sweep of weight tiles (the L2 holds the weights once)


def tma_fits(x: torch.Tensor, w: torch.Tensor, bm: int, bk: int, ks: int) -> bool:
    """Whether dot_rows(x, w) with a [bm, *, bk] tile and pieces of ks keys may load by TMA:
    128-row tiles, 16-bit float weights of the activations' dtype, contiguous rows whose
    strides and starts are 16-byte multiples (a descriptor's rule), whole K steps a piece."""
    return (bm >= 128 and x.is_cuda and w.dtype == x.dtype
            and x.dtype in (torch.bfloat16, torch.float16)
            and x.is_contiguous() and w.is_contiguous()
            and (x.shape[1] * x.element_size()) % 16 == 0 and ks % bk == 0
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0)


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    from .triton_dot_epilogue import act_pieces

    globals()["tl"] = tl
    globals().update(act_pieces())
    globals().update(pdl_pieces())

    @triton.jit
    def dot_tma_kernel(xd, wd, BIAS, Y, B, N, KS: tl.constexpr, PIECES: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GLU: tl.constexpr,
                       GELU: tl.constexpr, HAS_BIAS: tl.constexpr, GROUP: tl.constexpr,
                       PDL: tl.constexpr):
        _pdl_begin(PDL)                                                 # noqa: F821
        # program -> (row tile, column tile), GROUP row tiles a column sweep
        pid = tl.program_id(0)
        num_m = tl.cdiv(B, BM)
        per_group = GROUP * tl.cdiv(N, BN)
        first_m = (pid // per_group) * GROUP
        size_m = min(num_m - first_m, GROUP)
        om = (first_m + (pid % per_group) % size_m) * BM
        on = ((pid % per_group) // size_m) * BN
        STEPS: tl.constexpr = KS // BK
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        accu = tl.zeros((BM, BN), dtype=tl.float32)
        pa = tl.zeros((BM, BN), dtype=tl.float32)
        pu = tl.zeros((BM, BN), dtype=tl.float32)
        # split-K pieces, each from zero, summed in order onto a zero start -- as one loop over
        # every piece's K steps, so the TMA pipeline runs across piece ends (a loop a piece
        # drained and refilled it 7 times a tile: the 1B's down projection at 16k rows 0.42 ->
        # 0.40 ms, tma_persist_probe.py, twenty-seventh session)
        for i in range(PIECES * STEPS):
            k = (i // STEPS) * KS + (i % STEPS) * BK
            x = xd.load([om, k])                                        # [BM, BK]
            pa = tl.dot(x, tl.trans(wd.load([on, k])), pa)              # W rows [BN, BK]
            if GLU:
                pu = tl.dot(x, tl.trans(wd.load([N + on, k])), pu)
            if PIECES > 1:
                if i % STEPS == STEPS - 1:          # a piece's last step: into the total
                    acc += pa
                    pa = tl.zeros((BM, BN), dtype=tl.float32)
                    if GLU:
                        accu += pu
                        pu = tl.zeros((BM, BN), dtype=tl.float32)
        if PIECES == 1:                             # one piece: folded after (two live states)
            acc += pa
            if GLU:
                accu += pu
        rows = om + tl.arange(0, BM)
        cols = on + tl.arange(0, BN)
        cmask = cols < N
        b = 0.0
        if HAS_BIAS:
            b = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        y = _finish(acc, accu, 1.0, 1.0, b, False, HAS_BIAS, GLU, GELU,  # noqa: F821
                    Y.dtype.element_ty)
        tl.store(Y + rows[:, None].to(tl.int64) * N + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=(rows < B)[:, None] & cmask[None, :])

    return dot_tma_kernel


def dot_tma(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, n: int, glu: bool, gelu: bool,
            bias: torch.Tensor | None, tile: tuple[int, int, int, int, int], ks: int,
            pieces: int, pdl: bool, group: int = GROUP_M) -> torch.Tensor:
    """out [B, n] = dot_rows(x [B, K], w [n(*2), K]) through the TMA tiles: `tile` = (block_m,
    block_n, block_k, warps, stages), `pieces` split-K pieces of `ks` keys (1 piece: ks = K
    rounded up to the K step); `group` row tiles a sweep of weight tiles (speed only)."""
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, nw, st = tile
    B = x.shape[0]
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    grid = (triton.cdiv(B, bm) * triton.cdiv(n, bn),)
    _kernel()[grid](xd, wd, bias if bias is not None else w, out, B, n, KS=ks, PIECES=pieces,
                    BM=bm, BN=bn, BK=bk, GLU=glu, GELU=gelu, HAS_BIAS=bias is not None,
                    GROUP=group, num_warps=nw, num_stages=st, **pdl_launch(pdl))
    return out
