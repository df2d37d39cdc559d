"""dot_rows with the add+norm after it in its last program (MUSER_NORM_OUT): one launch where
a projection and the add_norm that consumes it were two.

Owns: `NormOut` (what add_norm would have been given besides the projection, and where h' and
x go), `tail_fuses` (whether a dot tile can norm as add_norm does), the kernel and its launch
(`dot_then_norm`).  Does not own: the dot (triton_dot.py's `_dot_body`, run unchanged), the
norm (triton_ops.norm_pieces: add_norm's own two halves), when a step uses it (decode_step.py).

Every program stores its tile (or its split-K piece) as dot_rows does, then takes a ticket
(CTA barrier, one gpu-scope acq_rel atomic: the decode attention's merge election).  The
last program to arrive sees every store, sets the counter back to 0 and runs add_norm's body for
each row in turn -- the pieces summed in order, h' = h + norm?(d1), x = norm(h') -- over a
[BLOCK] block at add_norm's warps (`_row_shape`: the reduction's tree), so h' and x are
add_norm's bits:

    programs:  tile 0 ─┐
               tile 1 ─┼─ store, barrier, ticket ──> the last: rows 0..B-1 through add_norm
               ...    ─┘                               (h' and x stored; counter = 0)

The rows go one after another in one program, so only steps of few rows gain (the launch it
saves is ~2 us; a row here is one round trip to the L2).  The counter is the step's: kernels
on one stream run their tails one after another (a dependent launch waits for the kernel
before it to finish), so one int32 serves every site of a step.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .triton_ops import _row_shape, norm_pieces, pdl_pieces


class NormOut(NamedTuple):
    """add_norm(h, w_next, eps, layernorm, d1=<the projection>, w_post=w_post), left to the
    projection's own launch; (h_out, x_out) receive h' and x; cnt: an int32 counter at 0."""
    h: torch.Tensor
    w_post: torch.Tensor | None
    w_next: torch.Tensor | None
    eps: float
    layernorm: bool
    cnt: torch.Tensor


def tail_fuses(n: int, warps: int, wq: bool) -> bool:
    """Whether a dot_rows tile of `warps` warps with N = n outputs can norm a row exactly as
    add_norm does: the same block and warps (`_row_shape`) and FMA contraction on as in
    add_norm (an int8 dot compiles without it)."""
    return not wq and _row_shape(n)["num_warps"] == warps


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    from . import triton_dot
    triton_dot._kernels()               # defines triton_dot's `_dot_body`
    globals()["tl"] = tl                # module globals: the interpreter resolves names there
    globals()["_dot_body"] = triton_dot._dot_body
    globals().update(pdl_pieces())
    globals().update(norm_pieces())

    @triton.jit
    def dot_tail_kernel(X, W, S, BIAS, Y, P, B, N, NH, NWP, NWN, NHO, NXO, CNT, eps,
                        K: tl.constexpr, KS: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr,
                        HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr,
                        PIECES_IN: tl.constexpr, WQ: tl.constexpr, PDL: tl.constexpr,
                        FLATTEN: tl.constexpr, WIDEN: tl.constexpr, PICK: tl.constexpr,
                        NN: tl.constexpr, NBLOCK: tl.constexpr, NPIECES: tl.constexpr,
                        POST: tl.constexpr, LAYERNORM: tl.constexpr, NEXT: tl.constexpr):
        _pdl_begin(PDL)
        _dot_body(X, W, S, BIAS, Y, P, B, N, K, KS, BLOCK_N, BLOCK_K, GLU, GELU, HAS_BIAS, SPLIT,
                  BM, PIECES_IN, WQ, FLATTEN, WIDEN, PICK)
        tl.debug_barrier()                  # the block's stores before its ticket
        total = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        ticket = tl.atomic_add(CNT, 1, sem="acq_rel", scope="gpu")
        if ticket == total - 1:
            tl.store(CNT, 0)
            i = tl.arange(0, NBLOCK)
            mask = i < NN
            for r in range(B):
                row = tl.zeros([], tl.int64) + r           # int64 addressing, as add_norm
                if NPIECES > 0:             # add_pieces_norm: the pieces in P, summed in order
                    h, d1 = _norm_inputs(NH, P, S, row, i, mask, B, NN, True, NPIECES, False)
                else:                       # add_norm: d1 is the stored projection
                    h, d1 = _norm_inputs(NH, Y, S, row, i, mask, B, NN, True, 0, False)
                _add_norm_tail(h, d1, row, i, mask, NH, NWP, NWN, NHO, NXO, eps, NN, True, False,
                               POST, LAYERNORM, NEXT)

    return dot_tail_kernel


def dot_then_norm(grid, tail: NormOut, n: int, warps: int, wq: bool, split: bool, pieces: int,
                  args, shape) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dot_tail_kernel's launch: dot_rows' arguments (`args`, `shape`), then the norm's.
    Returns (h', x) -- x None where `tail.w_next` is None."""
    if not tail_fuses(n, warps, wq) or tail.h.shape[1] != n:
        raise ValueError(f"a dot_rows with add_norm after it needs bf16 weights, N = the rows' "
                         f"width and add_norm's warps for it; got N {n}, rows "
                         f"{tuple(tail.h.shape)}, {warps} warps (add_norm: "
                         f"{_row_shape(n)['num_warps']}), int8 {wq}")
    h = tail.h
    h_out = torch.empty_like(h)
    x_out = torch.empty_like(h) if tail.w_next is not None else h_out
    w_any = tail.w_next if tail.w_next is not None else (tail.w_post if tail.w_post is not None
                                                         else h)
    _kernel()[grid](*args, h, tail.w_post if tail.w_post is not None else w_any, w_any, h_out,
                    x_out, tail.cnt, float(tail.eps), NN=n, NBLOCK=_row_shape(n)["BLOCK"],
                    NPIECES=pieces if split else 0, POST=tail.w_post is not None,
                    LAYERNORM=tail.layernorm, NEXT=tail.w_next is not None, **shape)
    return h_out, (x_out if tail.w_next is not None else None)
