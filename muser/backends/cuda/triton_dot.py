"""The decode step's projections on CUDA (Triton): rows that never see each other.

Owns: `dot_rows` (rows in tiles of 16 on the tensor cores, K in fixed steps and
optional fixed split-K pieces summed in order: the default for every projection
and the head, any batch size) and `gemv` (a latency-bound kernel for 1..B rows,
~10% faster at batch 1: MUSER_GEMV=fast), their measured tile tables and
configs.  Both are batch-invariant: row b of a B-row call is bitwise the row
computed alone.  Does not own: when they are used (decode_step.py), element-wise
pieces (triton_ops.py), attention (triton_decode.py).  Triton is imported
lazily: this module imports on a machine without it.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .triton_dot_tiles import CHUNK_K, CHUNK_ROWS, chunk_tile, dot_config
from .triton_ops import _pow2, pdl_launch, pdl_pieces


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def act_up(g, u, DT: tl.constexpr, GELU: tl.constexpr):
        """act(gate) * up from float32 sums, rounded where torch rounds: each product to the
        activation dtype DT, then the act.  One copy for every kernel here, so a row's split
        pieces summed apart (split_sum_kernel) or in the kernel (dot_rows_kernel) end alike."""
        gf = g.to(DT).to(tl.float32)
        uf = u.to(DT).to(tl.float32)
        if GELU:
            t = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)
            a = 0.5 * gf * (1.0 + (2.0 * tl.sigmoid(2.0 * t) - 1.0))
        else:
            a = gf * tl.sigmoid(gf)
        return a.to(DT).to(tl.float32) * uf

    globals()["_act_up"] = act_up
    globals()["tl"] = tl
    globals().update(pdl_pieces())

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

    @triton.jit
    def piece_dot(X, W, rm, rmask, cols, cmask, piece, N, K: tl.constexpr, KS: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GLU: tl.constexpr,
                  BM: tl.constexpr, EARLY: tl.constexpr = False, PDL: tl.constexpr = False):
        """One split-K piece [piece * KS, (piece + 1) * KS) of a [BM, BLOCK_N] tile (and its up
        half), from zero.  Each tl.dot chains its k16 MMA steps onto the accumulator, so an
        output element's sum is the k16 steps in order -- whatever BLOCK_K and BM are (the
        H200 agrees: benchmarks/dot_chunk_sweep.py).  EARLY (MUSER_PDL=early, the caller has
        not waited yet): the first K step's weights are loaded BEFORE the wait for the kernel
        before -- weights never depend on it, so their HBM latency overlaps its tail -- then
        the wait, then that step's dot: the loop's first pass, peeled (the same dots in the
        same order)."""
        acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
        accu = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
        k_first = 0
        if EARLY:
            kin = tl.arange(0, BLOCK_K)
            ks = piece * KS + kin
            kmask = (ks < K) & (kin < KS)
            wp = W + cols[:, None].to(tl.int64) * K + ks[None, :]
            m2 = cmask[:, None] & kmask[None, :]
            w0 = tl.load(wp, mask=m2, other=0)
            wu0 = w0
            if GLU:
                wu0 = tl.load(wp + N * K, mask=m2, other=0)
            _pdl_begin(PDL)
            x = tl.load(X + rm[:, None].to(tl.int64) * K + ks[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            acc = tl.dot(x, tl.trans(w0.to(x.dtype)), acc)
            if GLU:
                accu = tl.dot(x, tl.trans(wu0.to(x.dtype)), accu)
            k_first = BLOCK_K
        for k0 in range(k_first, KS, BLOCK_K):
            kin = k0 + tl.arange(0, BLOCK_K)
            ks = piece * KS + kin
            kmask = (ks < K) & (kin < KS)
            x = tl.load(X + rm[:, None].to(tl.int64) * K + ks[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            wp = W + cols[:, None].to(tl.int64) * K + ks[None, :]
            m2 = cmask[:, None] & kmask[None, :]
            # int8 weights enter the dot as the activation dtype: exact (|q| <= 127)
            acc = tl.dot(x, tl.trans(tl.load(wp, mask=m2, other=0).to(x.dtype)), acc)
            if GLU:
                accu = tl.dot(x, tl.trans(tl.load(wp + N * K, mask=m2, other=0).to(x.dtype)), accu)
        return acc, accu

    @triton.jit
    def finish(y, u, sy, su, b, WQ: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr,
               GELU: tl.constexpr, DT: tl.constexpr):
        """A row's float32 sums (all pieces) -> its output: the int8 rows' scales (sy, su), then
        the bias, then act(gate) * up -- the one epilogue of dot_rows and split_sum."""
        if WQ:
            y = y * sy
            if GLU:
                u = u * su
        if HAS_BIAS:
            y = y + b
        if GLU:
            y = _act_up(y, u, DT, GELU)
        return y

    globals()["_piece"] = piece_dot
    globals()["_finish"] = finish

    @triton.jit
    def dot_rows_kernel(X, W, S, BIAS, Y, P, B, N, K: tl.constexpr, KS: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GLU: tl.constexpr,
                        GELU: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                        BM: tl.constexpr, PIECES_IN: tl.constexpr, WQ: tl.constexpr,
                        PDL: tl.constexpr, FLATTEN: tl.constexpr = False,
                        EARLY: tl.constexpr = False):
        if not EARLY:
            _pdl_begin(PDL)                 # PDL: wait for the kernel before, first
        # Rows in tiles of BM (padded with zeros) through the tensor cores; K cut into pieces of
        # KS (program axis 2) walked in fixed BLOCK_K steps.  An output element's sum is the same
        # instruction sequence whatever B (and BM) is, and the other rows of a tile never enter
        # it: row b of a B-row call == the 1-row call.  SPLIT: write the piece's partial sums to
        # P [pieces, B, N(*2)]; `split_sum_kernel` adds the pieces in order 0, 1, 2, ...
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        piece = tl.program_id(2)
        cmask = cols < N
        rmask = rm < B
        if EARLY:
            acc, accu = _piece(X, W, rm, rmask, cols, cmask, piece, N, K, KS, BLOCK_N, BLOCK_K,
                               GLU, BM, True, PDL)
        elif PIECES_IN > 1:
            # the split-K pieces summed here, in order from zero: split_sum_kernel's float32
            # adds, without the round trip through P (a chunk's tiles: enough programs already)
            acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
            if GLU:
                accu = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
            # FLATTEN: Triton fuses this loop with the piece's K loop (its bounds do not depend
            # on pc) into one software-pipelined loop -- no pipeline drain and refill a piece
            for pc in tl.range(PIECES_IN, flatten=FLATTEN):
                pa, pu = _piece(X, W, rm, rmask, cols, cmask, pc, N, K, KS, BLOCK_N, BLOCK_K, GLU,
                                BM)
                acc += pa
                if GLU:
                    accu += pu
        else:
            acc, accu = _piece(X, W, rm, rmask, cols, cmask, piece, N, K, KS, BLOCK_N, BLOCK_K,
                               GLU, BM)
        om = rmask[:, None] & cmask[None, :]
        if not GLU:
            accu = acc                # (no up half: a stand-in the epilogue never reads)
        if SPLIT:
            width = 2 * N if GLU else N
            pp = P + (piece * B + rm[:, None]).to(tl.int64) * width + cols[None, :]
            tl.store(pp, acc, mask=om)
            if GLU:
                tl.store(pp + N, accu, mask=om)
        else:
            sy, su, b = 1.0, 1.0, 0.0
            if WQ:
                sy = tl.load(S + cols, mask=cmask, other=1.0)[None, :]
                if GLU:
                    su = tl.load(S + N + cols, mask=cmask, other=1.0)[None, :]
            if HAS_BIAS:
                b = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
            y = _finish(acc, accu, sy, su, b, WQ, HAS_BIAS, GLU, GELU, X.dtype.element_ty)
            tl.store(Y + rm[:, None].to(tl.int64) * N + cols[None, :], y.to(Y.dtype.element_ty),
                     mask=om)

    @triton.jit
    def split_sum_kernel(P, S, BIAS, Y, B, N, PIECES: tl.constexpr, BLOCK: tl.constexpr,
                         GLU: tl.constexpr, GELU: tl.constexpr, HAS_BIAS: tl.constexpr,
                         WQ: tl.constexpr, PDL: tl.constexpr):
        _pdl_begin(PDL)                     # PDL: wait for the kernel before, first
        b = tl.program_id(1)
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        cmask = cols < N
        width = 2 * N if GLU else N
        y = tl.zeros((BLOCK,), dtype=tl.float32)
        u = tl.zeros((BLOCK,), dtype=tl.float32)
        for piece in range(PIECES):                       # fixed order: 0, 1, 2, ...
            pp = P + (piece * B + b).to(tl.int64) * width + cols
            y += tl.load(pp, mask=cmask, other=0.0)
            if GLU:
                u += tl.load(pp + N, mask=cmask, other=0.0)
        sy, su, bias = 1.0, 1.0, 0.0
        if WQ:
            sy = tl.load(S + cols, mask=cmask, other=1.0)
            if GLU:
                su = tl.load(S + N + cols, mask=cmask, other=1.0)
        if HAS_BIAS:
            bias = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
        y = _finish(y, u, sy, su, bias, WQ, HAS_BIAS, GLU, GELU, Y.dtype.element_ty)
        tl.store(Y + b.to(tl.int64) * N + cols, y.to(Y.dtype.element_ty), mask=cmask)

    return gemv_kernel, dot_rows_kernel, split_sum_kernel


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
    kern = _kernels()[0]
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


class Pieces(NamedTuple):
    """A projection's split-K partial sums, not yet summed: part [pieces, B, N] float32 and the
    int8 rows' float32 scales (None for bf16 weights) -- `add_norm(d1=Pieces)` sums them as
    split_sum_kernel would, in the launch that consumes them."""
    part: torch.Tensor
    scale: torch.Tensor | None


def dot_rows(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, glu: bool = False,
             gelu: bool = False, bias: torch.Tensor | None = None,
             config: tuple[int, int, int, int, int] | None = None,
             rows: int | None = None,
             tile: tuple[int, int, int, int, int] | None = None,
             scale: torch.Tensor | None = None, pdl: bool = False,
             flatten: bool = False, defer: bool = False,
             early: bool = False) -> "torch.Tensor | Pieces":
    """The same function as `gemv`, for rows in tiles of 16 on the tensor cores (K in fixed
    steps, optionally in fixed split-K pieces summed in order): batch-invariant too, and far
    cheaper per extra row than `gemv`'s loop.  `config` = (block_n, block_k, warps, stages,
    keys per piece or 0) overrides `dot_config`.  From CHUNK_ROWS rows on (a prefill chunk)
    the tiles are `chunk_tile`'s (or `tile`'s): larger, any K step, the same pieces summed in
    the kernel -- the same bits per row; `rows=16` forces the decode tiles.  int8 `w` with
    float32 `scale` [rows of w]: W = scale[:, None] * w, each sum scaled once all its pieces are
    in (any tile, the same bits; H200: tests/cuda/test_triton_ops.py) -- the CUDA int8 weight
    mode (weights_int8.py).  `flatten` (MUSER_FLATTEN): pieces summed in the kernel run as one
    loop fused by Triton (the same dots and adds in the same order).  `defer`: where the pieces
    would be summed by split_sum_kernel (no act*up, no bias), return them unsummed as `Pieces`
    for triton_ops.add_norm to sum (MUSER_FUSE_SUM).  `early` (MUSER_PDL=early, with `pdl`): a
    decode tile loads its first K step's weights before waiting for the kernel before."""
    import triton
    kern, ssum = _kernels()[1], _kernels()[2]
    n, k = w.shape
    wq = w.dtype == torch.int8
    if wq and (scale is None or scale.dtype != torch.float32 or scale.shape != (n,)):
        raise ValueError(f"int8 weights [{n}, {k}] need a float32 scale of shape ({n},), got "
                         f"{None if scale is None else (scale.dtype, tuple(scale.shape))}")
    if glu:
        n //= 2
    x = x.contiguous()
    B = x.shape[0]
    bn, bk, nw, st, piece = config or dot_config(n, k, glu)
    pieces = triton.cdiv(k, piece) if piece else 1
    bm, inside = 16, 1
    if rows != 16 and (tile is not None or B >= CHUNK_ROWS):
        bm, bn, bk, nw, st = tile or chunk_tile(B, CHUNK_K.get((n, k, glu), bk), glu)
        if bm >= 128:            # enough programs without the pieces on the grid (512 rows: not)
            inside, pieces = pieces, 1
    out = out if out is not None else x.new_empty(B, n)
    split = pieces > 1
    ks = piece if pieces * inside > 1 else triton.cdiv(k, bk) * bk    # keys per piece
    part = (torch.empty((pieces, B, 2 * n if glu else n), dtype=torch.float32, device=x.device)
            if split else out)
    b_arg = bias if bias is not None else w
    s_arg = scale if wq else w
    # int8: no FMA contraction, so `sum * scale + bias` rounds alike in both epilogues
    fuse = {"enable_fp_fusion": False} if wq else {}
    kern[(triton.cdiv(n, bn), triton.cdiv(B, bm), pieces)](
        x, w, s_arg, b_arg, out, part, B, n, K=k, KS=ks, BLOCK_N=bn, BLOCK_K=bk, GLU=glu,
        GELU=gelu, HAS_BIAS=bias is not None, SPLIT=split, BM=bm, PIECES_IN=inside, WQ=wq,
        FLATTEN=bool(flatten) and inside > 1, EARLY=bool(early) and bm == 16,
        num_warps=nw, num_stages=st, **fuse,
        **pdl_launch(pdl))
    if split and defer and not glu and bias is None:
        return Pieces(part, scale if wq else None)
    if split:
        ssum[(triton.cdiv(n, 1024), B)](part, s_arg, b_arg, out, B, n, PIECES=pieces, BLOCK=1024,
                                         GLU=glu, GELU=gelu, HAS_BIAS=bias is not None, WQ=wq,
                                         num_warps=4, **fuse, **pdl_launch(pdl))
    return out
