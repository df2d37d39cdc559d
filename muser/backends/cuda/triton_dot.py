"""The decode step's projections on CUDA (Triton): rows that never see each other.

Owns: `dot_rows` (rows in tiles of 16 on the tensor cores, K in fixed steps and
optional fixed split-K pieces summed in order: the default for every projection
and the head, any batch size) and the split-K sum.
Batch-invariant: row b of a B-row call is bitwise the row computed alone.  Does not own: the
tile tables (triton_dot_tiles.py), the epilogue (triton_dot_epilogue.py), the weight tile of
each weight kind and the int8 tiles' layout fence (triton_dot_loads.py), the older batch-1 GEMV
(triton_gemv.py, MUSER_GEMV=fast), when they are used (decode_step.py), element-wise pieces
(triton_ops.py), attention (triton_decode.py).  Triton is imported lazily: this module imports
on a machine without it.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .triton_dot_epilogue import act_pieces
from .triton_dot_loads import load_pieces
from .triton_dot_tma import dot_tma, tma_fits
from .triton_dot_tiles import CHUNK_ROWS, WIDE_ROWS, chunk_tile, dot_config, tma_tile
from .triton_pieces import pdl_launch, pdl_pieces
from .triton_pick import pick_pieces


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    globals()["tl"] = tl
    globals().update(act_pieces())      # module globals: the interpreter resolves names there
    globals().update(pdl_pieces())
    globals().update(pick_pieces())
    globals().update(load_pieces())

    @triton.jit
    def piece_dot(X, W, rm, rmask, cols, cmask, piece, N, K: tl.constexpr, KS: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GLU: tl.constexpr,
                  BM: tl.constexpr, S=None, WQB: tl.constexpr = False,
                  FENCE: tl.constexpr = False):
        """One split-K piece [piece * KS, (piece + 1) * KS) of a [BM, BLOCK_N] tile (and its up
        half), from zero.  Each tl.dot chains its k16 MMA steps onto the accumulator, so an
        output element's sum is the k16 steps in order -- whatever BLOCK_K and BM are (the
        H200 agrees: benchmarks/dot_chunk_sweep.py).  WQB: BlockInt8 weights, their float16
        block scales at S [rows of W, K // 32], dequantized in the tile; FENCE: int8 weights
        on a GPU, behind the layout fence (`_weights_tile`)."""
        acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
        accu = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, KS, BLOCK_K):
            kin = k0 + tl.arange(0, BLOCK_K)
            ks = piece * KS + kin
            kmask = (ks < K) & (kin < KS)
            x = tl.load(X + rm[:, None].to(tl.int64) * K + ks[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            wp = W + cols[:, None].to(tl.int64) * K + ks[None, :]
            m2 = cmask[:, None] & kmask[None, :]
            ks0 = piece * KS + k0
            acc = tl.dot(x, tl.trans(_weights_tile(wp, S, cols, cmask, ks0, m2, K, BLOCK_N,
                                                   BLOCK_K, x.dtype, WQB, FENCE)), acc)
            if GLU:
                accu = tl.dot(x, tl.trans(_weights_tile(wp + N * K, S, cols + N, cmask, ks0, m2,
                                                        K, BLOCK_N, BLOCK_K, x.dtype, WQB,
                                                        FENCE)), accu)
        return acc, accu

    globals()["_piece"] = piece_dot


    @triton.jit
    def dot_rows_kernel(X, W, S, BIAS, Y, P, B, N, K: tl.constexpr, KS: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GLU: tl.constexpr,
                        GELU: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                        BM: tl.constexpr, PIECES_IN: tl.constexpr, WQ: tl.constexpr,
                        PDL: tl.constexpr, FLATTEN: tl.constexpr = False,
                        WIDEN: tl.constexpr = False, PICK: tl.constexpr = False,
                        WQB: tl.constexpr = False, FENCE: tl.constexpr = False):
        _pdl_begin(PDL)                     # PDL: wait for the kernel before, first
        _dot_body(X, W, S, BIAS, Y, P, B, N, K, KS, BLOCK_N, BLOCK_K, GLU, GELU, HAS_BIAS, SPLIT,
                  BM, PIECES_IN, WQ, FLATTEN, WIDEN, PICK, WQB, FENCE)

    @triton.jit
    def dot_body(X, W, S, BIAS, Y, P, B, N, K: tl.constexpr, KS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GLU: tl.constexpr,
                 GELU: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                 BM: tl.constexpr, PIECES_IN: tl.constexpr, WQ: tl.constexpr,
                 FLATTEN: tl.constexpr, WIDEN: tl.constexpr, PICK: tl.constexpr,
                 WQB: tl.constexpr = False, FENCE: tl.constexpr = False):
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
        if PIECES_IN > 1:
            # the split-K pieces summed here, in order from zero: split_sum_kernel's float32
            # adds, without the round trip through P (a chunk's tiles: enough programs already)
            acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
            if GLU:
                accu = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
            # FLATTEN: Triton fuses this loop with the piece's K loop (its bounds do not depend
            # on pc) into one software-pipelined loop -- no pipeline drain and refill a piece
            for pc in tl.range(PIECES_IN, flatten=FLATTEN):
                pa, pu = _piece(X, W, rm, rmask, cols, cmask, pc, N, K, KS, BLOCK_N, BLOCK_K, GLU,
                                BM, S, WQB, FENCE)
                acc += pa
                if GLU:
                    accu += pu
        else:
            acc, accu = _piece(X, W, rm, rmask, cols, cmask, piece, N, K, KS, BLOCK_N, BLOCK_K,
                               GLU, BM, S, WQB, FENCE)
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
            if WIDEN:       # float32 Y holding the activation-dtype values (`.float()` fused)
                y = y.to(X.dtype.element_ty).to(tl.float32)
            if PICK:
                # the greedy pick's first pass (triton_pick.py): each row's first maximum in
                # this tile, NaN read as -inf and +inf as the largest float; Y = the values,
                # P = their columns, [B, tiles]; no logits are stored
                y = tl.where(cmask[None, :], _pick_key(y, 3.4028234663852886e38), float("-inf"))
                at = rm.to(tl.int64) * tl.num_programs(0) + tl.program_id(0)
                tl.store(Y + at, tl.max(y, 1), mask=rmask)
                first = tl.argmax(y, 1, tie_break_left=True)
                tl.store(P + at, (tl.program_id(0) * BLOCK_N + first).to(tl.int64), mask=rmask)
            else:
                tl.store(Y + rm[:, None].to(tl.int64) * N + cols[None, :],
                         y.to(Y.dtype.element_ty), mask=om)

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

    globals()["_dot_body"] = dot_body
    return dot_rows_kernel, split_sum_kernel


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
             widen: bool = False, pick: bool = False, tma: bool = False,
             own_tile: bool = False):
    """The same function as `gemv`, for rows in tiles of 16 on the tensor cores (K in fixed
    steps, optionally in fixed split-K pieces summed in order): batch-invariant too, and far
    cheaper per extra row than `gemv`'s loop.  `config` = (block_n, block_k, warps, stages,
    keys per piece or 0) overrides `dot_config`.  From CHUNK_ROWS rows on (a prefill chunk)
    the tiles are `chunk_tile`'s (or `tile`'s): larger, any K step, the same pieces summed in
    the kernel -- the same bits per row; `rows=16` forces the decode tiles.  int8 `w` with
    float32 `scale` [rows of w]: W = scale[:, None] * w, each sum scaled once all its pieces are
    in (any tile, the same bits; H200: tests/cuda/test_triton_ops.py) -- the CUDA int8 weight
    mode (weights_int8.py); with float16 `scale` [rows of w, K // 32] (BlockInt8, GGUF's
    Q8_0): each weight is dequantized to the activation dtype in the tile, the dot then the
    float one's (quant="int8-head").  `flatten` (MUSER_FLATTEN): pieces summed in the kernel
    run as one loop fused by Triton (the same dots and adds in the same order).  `defer`: where
    the pieces would be summed by split_sum_kernel (no act*up, no bias), return them unsummed as
    `Pieces` for triton_ops.add_norm to sum (MUSER_FUSE_SUM).  `widen`: a float32 result holding
    the activation-dtype values -- `dot_rows(...).float()` bit for bit, without the copy launch
    (the LM head: 16 rows x 262,144 logits cost a 12.6 us copy on the H200).  `pick`: no output;
    the widened values' first maximum a row and tile -> (values float32, columns int64), each
    [B, tiles], for `triton_pick.pick_partials` (the pipelined greedy step's head; no pieces, no
    act*up).  `tma`
    (MUSER_DOT_TMA): 128-row tiles of 16-bit weights load by TMA (triton_dot_tma.py: the same
    pieces, dots and epilogue -- the same bits).  `own_tile` (int8 rows, `rows=16`:
    quant="int8-head-fast"'s head): the int8 operand in Triton's own layout (no fence: faster,
    k summed in an order no other tile has), so the caller sends every row through this tile.
    Returns the output, or `Pieces` (defer), or the (values, columns) pair (pick)."""
    import triton
    kern, ssum = _kernels()
    n, k = w.shape
    wq = w.dtype == torch.int8
    wqb = wq and scale is not None and scale.dim() == 2          # BlockInt8: scales in the tile
    if wq and not (scale is not None and (scale.dtype, tuple(scale.shape)) in
                   ((torch.float32, (n,)), (torch.float16, (n, k // 32))) and not (wqb and k % 32)):
        raise ValueError(f"int8 weights [{n}, {k}] need a float32 scale of shape ({n},) or a "
                         f"float16 one of shape ({n}, {k // 32}) (K a multiple of 32), got "
                         f"{None if scale is None else (scale.dtype, tuple(scale.shape))}")
    if own_tile and not (wq and not wqb and rows == 16 and not glu):
        raise ValueError("own_tile is int8 rows (a float32 scale a row) through the 16-row "
                         f"decode tile (rows=16) without act*up, got {w.dtype} weights"
                         f"{' in blocks' if wqb else ''}, rows={rows}, glu={glu}: any other tile "
                         "sums k in another order, and the rows would part")
    if glu:
        n //= 2
    x = x.contiguous()
    B = x.shape[0]
    bn, bk, nw, st, piece = config or dot_config(n, k, glu)
    pieces = triton.cdiv(k, piece) if piece else 1
    bm, inside = 16, 1
    ttile = None
    if rows != 16 and (tile is not None or B >= CHUNK_ROWS):
        ttile = (tile or tma_tile(n, k, glu, B)) if tma else None
        # below WIDE_ROWS a TMA tile may be 128 rows where the pointer tile is 64: its shape is
        # the launch's (and the pointer tile's where TMA does not fit: widened, int8)
        small = ttile if B < WIDE_ROWS else None
        bm, bn, bk, nw, st = tile or small or chunk_tile(B, glu, piece)
        if bm >= 128:            # enough programs without the pieces on the grid (512 rows: not)
            inside, pieces = pieces, 1
    split = pieces > 1
    if pick and (split or glu or out is not None):
        raise ValueError(f"a picking dot_rows takes no split-K pieces, act*up or out tensor "
                         f"(pieces {pieces}, glu {glu}, out given {out is not None})")
    if pick:
        tiles = (B, triton.cdiv(n, bn))
        out = torch.empty(tiles, dtype=torch.float32, device=x.device)
        part = torch.empty(tiles, dtype=torch.int64, device=x.device)
    elif widen and (split or out is not None or x.dtype == torch.float32):
        return dot_rows(x, w, out=out, glu=glu, gelu=gelu,
                        bias=bias, config=config, rows=rows, tile=tile, scale=scale, pdl=pdl,
                        flatten=flatten, own_tile=own_tile).float()
    else:
        out = out if out is not None else x.new_empty(B, n, dtype=torch.float32 if widen else None)
        part = (torch.empty((pieces, B, 2 * n if glu else n), dtype=torch.float32,
                            device=x.device) if split else out)
    ks = piece if pieces * inside > 1 else triton.cdiv(k, bk) * bk    # keys per piece
    if (ttile and not (split or pick or widen or wq)
            and tma_fits(x, w, bm, ttile[2], ks)):
        return dot_tma(x, w, out, n, glu, gelu, bias, ttile, ks, inside, pdl)
    b_arg = bias if bias is not None else w
    s_arg = scale if wq else w
    # int8: no FMA contraction, so `sum * scale + bias` rounds alike in both epilogues
    fuse = {"enable_fp_fusion": False} if wq else {}
    grid = (triton.cdiv(n, bn), triton.cdiv(B, bm), pieces)
    wqr = wq and not wqb                     # row scales: applied to each finished sum
    shape = dict(K=k, KS=ks, BLOCK_N=bn, BLOCK_K=bk, GLU=glu, GELU=gelu,
                 HAS_BIAS=bias is not None, SPLIT=split, BM=bm, PIECES_IN=inside, WQ=wqr,
                 FLATTEN=bool(flatten) and inside > 1, WIDEN=widen or pick, PICK=pick,
                 **({"WQB": True} if wqb else {}),
                 # int8 on a GPU: the layout fence (inline asm: not under the interpreter, whose
                 # tensors are the CPU's)
                 **({"FENCE": True} if wq and w.is_cuda and not own_tile else {}),
                 num_warps=nw, num_stages=st, **fuse, **pdl_launch(pdl))
    kern[grid](x, w, s_arg, b_arg, out, part, B, n, **shape)
    if pick:
        return out, part
    if split and defer and not glu and bias is None:
        return Pieces(part, scale if wqr else None)
    if split:
        ssum[(triton.cdiv(n, 1024), B)](part, s_arg, b_arg, out, B, n, PIECES=pieces, BLOCK=1024,
                                         GLU=glu, GELU=gelu, HAS_BIAS=bias is not None, WQ=wqr,
                                         num_warps=4, **fuse, **pdl_launch(pdl))
    return out
