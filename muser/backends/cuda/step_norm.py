"""The add+norm a decode step may leave to the projection after it (MUSER_DOT_CPP=norm).

Owns: `Pending` -- add_norm(h, w_next, d1=d1, w_post=w_post) not run yet, its h' buffer already
allocated -- and the two ways it ends: `fused` (the CUDA C++ projection makes x itself, in
add_norm's own reduction tree, and stores h': cpp_dot.CppDot.norm) or `ready` (the add_norm
launch, into the same h' buffer: what every other consumer gets); and `norm_later`, which
models may defer at all (Gemma 3's sandwich layers: an RMS post-norm and a next norm, no MoE,
no layer scale).  Either way h' and x carry add_norm's bits, so a layer's output does not
depend on which one ran.

    layer i:  ... o ──┐                      gate|up
                      add_norm(h, pre_ffn) ──► x ──►      (two launches)
                      └────── Pending ────────────►  gate|up with x made in it   (one)

Does not own: where the step defers (`DecodeStep._add_norm`: not before the head), the kernels
(triton_ops.add_norm, csrc/gemv_mma.cu), the layer loop (decode_step.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .triton_dot_tiles import dot_config
from .triton_ops import add_norm


@dataclass(frozen=True)
class Pending:
    """add_norm(h, w_next, d1=d1, w_post=w_post) to come; h' lands in h_out (valid once the
    projection that consumes this has run, fused or not).  Not a tuple: add_norm reads a tuple
    d1 as split-K pieces."""
    h: torch.Tensor                 # [rows, N] bf16, the residual stream before
    d1: object                      # [rows, N] bf16, or triton_dot.Pieces
    w_post: torch.Tensor            # [N] float32
    w_next: torch.Tensor            # [N] float32
    h_out: torch.Tensor             # [rows, N]: h'

    @property
    def shape(self) -> torch.Size:   # what via_dot reads of an x: its rows
        return self.h.shape


def ready(step, x):
    """x itself, or a Pending's x by the add_norm launch (its h' into the Pending's buffer)."""
    if not isinstance(x, Pending):
        return x
    return add_norm(x.h, x.w_next, step.spec.norm_eps, step.layernorm, d1=x.d1, w_post=x.w_post,
                    h_out=x.h_out, pdl=step.pdl)[1]


def fused(step, x: Pending, w, kw: dict) -> torch.Tensor | None:
    """The projection of a Pending's x by the C++ kernel that makes x (`_dot`'s keywords; bf16
    or int8 rows), or None where it does not take it (a bias, a widened or picking head, more
    than 16 rows, a split-K tile, int8 rows' scaled pieces before it, a layout add_norm's tree
    does not have)."""
    if step.cpp is None or kw.get("bias") is not None or kw.get("pick") or kw.get("widen"):
        return None
    glu = kw.get("glu", False)
    n, k = (w.shape[0] // 2 if glu else w.shape[0]), w.shape[1]
    plan = step.cpp.norm_plan(x.h, x.d1, x.w_post, x.w_next, w, n, glu, kw.get("gelu", False),
                              dot_config(n, k, glu)[4], step.layernorm)
    if plan is None:
        return None
    return step.cpp.norm(x.h, x.d1, x.w_post, x.w_next, step.spec.norm_eps, w, n, plan,
                         step.pdl, h_out=x.h_out)[1]


def norm_later(spec, weights, cpp, variant: str) -> bool:
    """May this step leave its add+norms to the projections (`Pending`)?  MUSER_DOT_CPP=norm
    with the kernel loaded, and layers of the one shape it replays: sandwich RMS norms (h' =
    h + norm(d1, w_post); x = norm(h', w_next)), no parallel block, no MoE, no layer scale."""
    return (cpp is not None and variant == "norm" and spec.sandwich_norm and spec.pre_norm
            and not spec.parallel_block and spec.norm == "rms"
            and all(lw.moe is None and lw.layer_scale is None for lw in weights.layers))
