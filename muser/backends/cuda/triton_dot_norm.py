"""dot_rows' norm prologue, the host side (MUSER_NORM_IN): an add+norm left to the projection
that reads its x.

Owns: `NormIn` (what add_norm would have been given, and where its h' and x go), `norm_in`
(one, allocated up front), `norm_fuses` (whether a dot tile can norm as add_norm does) and
`launch_norm` (dot_norm_kernel's launch).  Does not own: the kernel (triton_dot.py's
`dot_norm_kernel`, which runs add_norm's own pieces from triton_ops.norm_pieces before the
shared dot body), when a step uses it (decode_step.py `_takes_norm`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .triton_ops import _row_shape


class NormIn(NamedTuple):
    """x = add_norm(h, w_next, d1=d1, w_post=w_post)'s x, left to the dot_rows that reads it
    (`dot_rows(NormIn, ...)`: one launch, `dot_norm_kernel`); h_out and x are where h' and x
    go, allocated up front so that the caller holds h' before the launch (`norm_in`)."""
    h: torch.Tensor
    d1: "torch.Tensor | tuple"
    w_post: torch.Tensor | None
    w_next: torch.Tensor
    eps: float
    layernorm: bool
    h_out: torch.Tensor
    x: torch.Tensor

    @property
    def shape(self):
        return self.h.shape


def norm_in(h: torch.Tensor, w_next: torch.Tensor, eps: float, layernorm: bool,
            d1: "torch.Tensor | tuple", w_post: torch.Tensor | None = None) -> NormIn:
    """add_norm(h, w_next, eps, layernorm, d1=d1, w_post=w_post) as a NormIn: (h', x) are
    (.h_out, .x) once a dot_rows has read it."""
    return NormIn(h, d1, w_post, w_next, float(eps), layernorm, torch.empty_like(h),
                  torch.empty_like(h))


def norm_fuses(k: int, warps: int, wq: bool) -> bool:
    """Whether a dot_rows tile of `warps` warps over K = k can norm its own input exactly as
    add_norm does: the same block and warps (`_row_shape`: the reduction's tree) and FMA
    contraction on as in add_norm (an int8 dot compiles without it)."""
    return not wq and _row_shape(k)["num_warps"] == warps


def launch_norm(kern_norm, grid, norm: NormIn, k: int, warps: int, wq: bool, args, shape):
    """dot_norm_kernel's launch: dot_rows' arguments, then the norm's (add_norm's)."""
    if not norm_fuses(k, warps, wq) or norm.h.shape != norm.x.shape or norm.h.shape[1] != k:
        raise ValueError(f"a norm-in dot_rows needs bf16 weights, K = the rows' width and "
                         f"add_norm's warps for it; got K {k}, rows {tuple(norm.h.shape)}, "
                         f"{warps} warps (add_norm: {_row_shape(k)['num_warps']}), int8 {wq}")
    d1 = norm.d1
    part, sc = (d1.part, d1.scale) if isinstance(d1, tuple) else (d1, None)
    kern_norm[grid](*args, norm.h, part, sc if sc is not None else part,
                    norm.w_post if norm.w_post is not None else norm.w_next, norm.w_next,
                    norm.h_out, norm.eps, NBLOCK=_row_shape(k)["BLOCK"],
                    NPIECES=part.shape[0] if isinstance(d1, tuple) else 0, NWQ=sc is not None,
                    POST=norm.w_post is not None, LAYERNORM=norm.layernorm, **shape)
