"""Shared pieces of the decode step's Triton kernels: what several launches call alike.

Owns: `_pow2` (block sizes), `upload` (a small host tensor up without a wait), `pdl_launch` /
`pdl_pieces` (programmatic dependent launch: the wait every PDL kernel starts with, and its
form with an L2 prefetch row), `rope_pieces` (the rotation's halves) and `norm_pieces`
(add_norm's inputs and tail).  One copy each: launches that call the same piece compute the
same bits.  Does not own: any kernel (triton_ops.py, triton_dot.py, triton_decode_kernel.py,
...) or what the prefetch row asks for (l2_prefetch.py).

Each `*_pieces()` returns @triton.jit functions under the names kernels call them; a kernel
module puts them in its own globals (`globals().update(...)`), because Triton -- and its
interpreter -- resolve a jit function's callees in the caller's module.  Inlined by Triton:
moving a piece here changes no binary (benchmarks/sm90_ptx.py).  Triton is imported lazily.
"""
from __future__ import annotations

import functools

import torch

from .l2_prefetch import prefetch_pieces


def _pow2(x: int, lo: int = 1) -> int:
    """The least power of two >= x, and at least `lo` (itself a power of two)."""
    p = lo
    while p < x:
        p *= 2
    return p


def upload(host: torch.Tensor, device) -> torch.Tensor:
    """A small host tensor on `device` without waiting: pinned and non-blocking on CUDA (a plain
    upload from pageable memory waits for the stream to drain, which keeps the host from
    running ahead of the GPU); as is elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def pdl_launch(pdl: bool) -> dict:
    """Launch options for a kernel that takes PDL: programmatic dependent launch (sm_90) -- the
    kernel may launch while the one before it finishes and waits for it on the device
    (`gdc_wait` at its top), which hides the launch gap between a decode step's ~200 kernels.
    Nothing runs before the wait, so no result can change (MUSER_PDL, decode_step.py)."""
    return {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}


@functools.lru_cache(maxsize=None)
def pdl_pieces() -> dict:
    """`_pdl_begin(PDL)`, the first statement of every kernel that takes PDL (pdl_launch): with
    PDL, wait for the kernel before, then let the next one launch -- before anything else."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals

    @triton.jit
    def pdl_begin(PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    globals()["_pdl_begin"] = pdl_begin
    globals().update(prefetch_pieces())

    @triton.jit
    def pdl_prefetch_begin(mine, idx, PF0, PN0, PF1, PN1, PF2, PN2, PCH, PDL: tl.constexpr,
                           NPF: tl.constexpr, PF_LANES: tl.constexpr):
        """_pdl_begin for a launch with a prefetch row (NPF > 0, l2_prefetch.py): after the PDL
        wait, a program that is `mine` asks the L2 for chunk-program `idx` of the ranges.
        NPF 0: _pdl_begin alone (`mine` and `idx` unused, compiled out)."""
        _pdl_begin(PDL)                     # PDL: wait for the kernel before, first
        if NPF > 0:
            if mine:
                _prefetch_l2(PF0, PN0, PF1, PN1, PF2, PN2, PCH, idx, PF_LANES)

    return {"_pdl_begin": pdl_begin, "_pdl_prefetch_begin": pdl_prefetch_begin}


@functools.lru_cache(maxsize=None)
def rope_pieces() -> dict:
    """The rotation's two halves as every kernel that rotates reads them (the decode launch's
    prologue, qk_rope_store, a chunk's norm_rope rows): `_halves(i, HALF, INTERLEAVED)` -> the
    dims (i0, i1) of pair i -- (2i, 2i + 1) interleaved, (i, i + D/2) split -- and
    `_rotate(a0, a1, c, s)` -> the pair rotated by (cos, sin), in float32 as given.
    Inlined by Triton: a kernel calling them compiles to what it wrote out before
    (benchmarks/sm90_ptx.py fingerprints)."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl

    @triton.jit
    def halves(i, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
        if INTERLEAVED:                            # pairs (2i, 2i + 1)
            i0 = 2 * i
            i1 = 2 * i + 1
        else:                                      # pairs (i, i + D/2)
            i0 = i
            i1 = i + HALF
        return i0, i1

    @triton.jit
    def rotate(a0, a1, c, s):
        return a0 * c - a1 * s, a1 * c + a0 * s

    return {"_halves": halves, "_rotate": rotate}


@functools.lru_cache(maxsize=None)
def norm_pieces() -> dict:
    """add_norm's two halves by the names the kernels call them, for every launch that norms a
    row (add_norm, its pieces form, embed_norm; benchmarks/add_norm_rows_probe.py):
    `_norm_inputs` (a row of h and its delta d1: one tensor, or a projection's split-K pieces
    summed in order as split_sum_kernel sums them) and `_add_norm_tail` (h' = h + norm?(d1)
    stored, x = norm(h')).  One copy: launches that norm a row alike give the same bits."""
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals

    @triton.jit
    def norm_inputs(H, D1, S, row, i, mask, B, N: tl.constexpr, HAS_D1: tl.constexpr,
                    PIECES: tl.constexpr, WQ: tl.constexpr):
        """(h, d1 as float32) of one row; PIECES > 0: D1 holds [PIECES, B, N] float32 partial
        sums, added in order from zero, scaled (int8 rows' S) and rounded to h's dtype."""
        h = tl.load(H + row * N + i, mask=mask, other=0.0)
        d1 = h
        if HAS_D1:
            if PIECES > 0:
                y = tl.zeros(h.shape, dtype=tl.float32)
                for piece in range(PIECES):                   # fixed order: 0, 1, 2, ...
                    y += tl.load(D1 + (piece * B + row) * N + i, mask=mask, other=0.0)
                if WQ:
                    y = y * tl.load(S + i, mask=mask, other=1.0)
                d1 = y.to(h.dtype).to(tl.float32)
            else:
                d1 = tl.load(D1 + row * N + i, mask=mask, other=0.0).to(tl.float32)
        return h, d1

    @triton.jit
    def add_norm_tail(h, d1, row, i, mask, D2, W_POST, W_NEXT, H_OUT, X_OUT, eps, N: tl.constexpr,
                      HAS_D1: tl.constexpr, HAS_D2: tl.constexpr, POST: tl.constexpr,
                      LAYERNORM: tl.constexpr, NEXT: tl.constexpr):
        """add_norm after its inputs are in: h' = h + norm?(d1) [+ d2] stored, x = norm(h')."""
        if HAS_D1:
            if POST:
                wp = tl.load(W_POST + i, mask=mask, other=0.0)
                if LAYERNORM:
                    xc = tl.where(mask, d1 - tl.sum(d1, 0) / N, 0.0)
                    d1 = xc * tl.rsqrt(tl.sum(xc * xc, 0) / N + eps) * wp
                else:
                    d1 = d1 * tl.rsqrt(tl.sum(d1 * d1, 0) / N + eps) * wp
                d1 = d1.to(h.dtype).to(tl.float32)
            h = (h.to(tl.float32) + d1).to(h.dtype)
            if HAS_D2:
                d2 = tl.load(D2 + row * N + i, mask=mask, other=0.0).to(tl.float32)
                h = (h.to(tl.float32) + d2).to(h.dtype)
            tl.store(H_OUT + row * N + i, h, mask=mask)
        if NEXT:
            wn = tl.load(W_NEXT + i, mask=mask, other=0.0)
            x = h.to(tl.float32)
            if LAYERNORM:
                xc = tl.where(mask, x - tl.sum(x, 0) / N, 0.0)
                x = xc * tl.rsqrt(tl.sum(xc * xc, 0) / N + eps) * wn
            else:
                x = x * tl.rsqrt(tl.sum(x * x, 0) / N + eps) * wn
            tl.store(X_OUT + row * N + i, x.to(h.dtype), mask=mask)

    return {"_norm_inputs": norm_inputs, "_add_norm_tail": add_norm_tail}
