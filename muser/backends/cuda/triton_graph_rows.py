"""The captured chunk pass's row moves (Triton): where a graph puts K/V rows before it attends.

Owns: `place_rows` (a chunk's own K/V rows into a growing plane, at the rows past its end, read
from the device) and `fill_shadow` (a ring's history, in position order, into the bucket's
ordered shadow).  Does not own: which layer takes which (chunk_graph.py asks the plane's
`writes_ahead`), the bookkeeping (the rows are committed after the replay, cache/many.py), the
attention (triton_chunk.py).

Why: a captured pass reads the planes by device tables (one graph serves every session and
position), and read that way the K/V tiles of a plane in place with the chunk's own rows from
a second buffer compiled to scalar 16-bit loads with ~1 KB of spills a thread (a ring's wrapped
addressing: ~3 KB): 2-3x the eager kernel (benchmarks/NOTES.md, twenty-fifth and twenty-sixth
sessions).  With the keys in one ordered view the captured kernel is the eager one:

    growing plane   rows [0, len) history | [len, len + R) the chunk's, placed here first
                    -- a growing plane never overwrites a live row, so rows past its end are
                    not committed state until `advance` (Plane.make_room checked they fit)
    ring plane      shadow [0, cap) = positions start - cap .. start - 1, gathered from the
                    ring (slot (s0 + j) % cap, s0 = the slot of `start`) | [cap, cap + Rb) the
                    chunk's rows, which prepare_rows writes there directly

META (per layer, int64 [6], chunk_graph.py): (start, R, first, s0, capacity, key rows).  Rows
the graph moves are copies: the same bits the eager pass stores.
"""
from __future__ import annotations

import functools

import torch

from .triton_pieces import _pow2


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    globals()["tl"] = tl                # the interpreter looks for the language in module globals

    @triton.jit
    def plane_rows(TAB, row, DT: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        """(k, v) pointers to the KV * D elements of plane row `row`, by a table row (k_ptr,
        v_ptr, row stride, head stride); BLOCK >= KV * D."""
        c = tl.arange(0, BLOCK)
        off = row * tl.load(TAB + 2) + (c // D) * tl.load(TAB + 3) + c % D
        return (tl.load(TAB).to(tl.pointer_type(DT)) + off,
                tl.load(TAB + 1).to(tl.pointer_type(DT)) + off)

    globals()["_plane_rows"] = plane_rows   # by module name: how Triton finds a called jit

    @triton.jit
    def place_kernel(SK, SV, TAB, META, KVD: tl.constexpr, D: tl.constexpr,
                     BLOCK: tl.constexpr):
        """Program r: the chunk's row r [KV, D] (SK / SV rows of KVD) to the plane's row
        start - first + r, if r < R (the bucket's padding rows stay out)."""
        r = tl.program_id(0)
        if r < tl.load(META + 1):
            row = tl.load(META) - tl.load(META + 2) + r
            kd, vd = _plane_rows(TAB, row, SK.dtype.element_ty, D, BLOCK)     # noqa: F821
            c = tl.arange(0, BLOCK)
            ok = c < KVD
            src = r.to(tl.int64) * KVD + c
            tl.store(kd, tl.load(SK + src, mask=ok), mask=ok)
            tl.store(vd, tl.load(SV + src, mask=ok), mask=ok)

    @triton.jit
    def shadow_kernel(TAB, META, DK, DV, cap, KVD: tl.constexpr, D: tl.constexpr,
                      BLOCK: tl.constexpr):
        """Program j: shadow row j (rows of KVD) <- ring slot (s0 + j) % cap."""
        j = tl.program_id(0)
        ks, vs = _plane_rows(TAB, (tl.load(META + 3) + j) % cap,                # noqa: F821
                             DK.dtype.element_ty, D, BLOCK)
        c = tl.arange(0, BLOCK)
        ok = c < KVD
        dst = j.to(tl.int64) * KVD + c
        tl.store(DK + dst, tl.load(ks, mask=ok), mask=ok)
        tl.store(DV + dst, tl.load(vs, mask=ok), mask=ok)

    return place_kernel, shadow_kernel


def place_rows(k: torch.Tensor, v: torch.Tensor, tab: torch.Tensor, meta: torch.Tensor) -> None:
    """k / v [Rb, KV, D] contiguous: rows [0, META R) into the plane TAB points at, from row
    META start - first on (tab int64 [4]: k_ptr, v_ptr, row stride, head stride)."""
    Rb, KV, D = k.shape
    _kernels()[0][(Rb,)](k, v, tab, meta, KVD=KV * D, D=D, BLOCK=_pow2(KV * D, 16),
                         num_warps=4)


def fill_shadow(tab: torch.Tensor, meta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                cap: int) -> None:
    """dk / dv [>= cap, KV, D] contiguous: rows [0, cap) <- the ring TAB points at (capacity
    `cap`), slot META s0 first, in position order."""
    KV, D = dk.shape[1], dk.shape[2]
    _kernels()[1][(cap,)](tab, meta, dk, dv, int(cap), KVD=KV * D, D=D, BLOCK=_pow2(KV * D, 16),
                          num_warps=4)
