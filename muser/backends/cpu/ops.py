"""The CPU ops table: RMS norms and qk-norm + RoPE through the native kernel.

Owns: `cpu_ops(native_ok)`, the `model.ops.Ops` the CPU backend runs.
With the native kernels (muser.model.native, built once per process unless
MUSER_NATIVE=0 or no compiler), an RMS norm and a qk-norm + RoPE of a float32
or bfloat16 tensor are one native call each (same maths in one pass: the eager
version is a dozen tiny ops per call; tested against the eager maths); layer
norms, other dtypes and act * up stay eager.  Without them, the eager table.
Does not own: the kernels (model/native.py, csrc/) or the maths (transformer.py).
"""
from __future__ import annotations

import torch

from ...model import native
from ...model import ops
from ...model.ops import Ops

NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def _norm(x, w, spec):
    if spec.norm == "rms" and x.dtype in NATIVE_DTYPES:
        return native.norm_rope(x, w, spec.norm_eps)
    return ops.norm(x, w, spec)


def _norm_rope(x, w, spec, cos, sin):
    if w is None and cos is None:
        return x
    if spec.norm == "rms" and x.dtype in NATIVE_DTYPES:
        return native.norm_rope(x, w, spec.norm_eps, cos, sin, spec.rope_interleaved)
    return ops.norm_rope(x, w, spec, cos, sin)


def _residual(h, d, spec, w_post=None, w_next=None, d2=None):
    return ops.residual(h, d, spec, w_post, w_next, d2, norm_fn=_norm)


NATIVE = Ops(norm=_norm, norm_rope=_norm_rope, act_mul=ops.act_mul, residual=_residual,
             rope_rows=ops.rope_rows_asked)


def cpu_ops(native_ok: bool) -> Ops:
    return NATIVE if native_ok else ops.EAGER
