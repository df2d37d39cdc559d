"""Turning a float `Weights` into the CPU fast path: int8 weights, fused projections.

Owns: `FastLinear` (a projection with int8 weights for few rows -- decode steps
and verification blocks -- and an optional dense bf16 copy for prefill chunks)
and `quantize_weights`.  Does not own: the kernels (`quant.py`) or when the
path is used (the engine's `quant=` setting, engine/defaults.py).

Why two copies: per token, decode reads every weight once, so bytes rule and
int8 halves them against bf16; a 512-row prefill chunk is arithmetic-bound,
where oneDNN's bf16 GEMM is ~4x faster than the int8 weight-only kernel.  The
switch depends on the row count only (> DENSE_ROWS), so a given chunking always
takes the same kernels: the restore contract holds, and verification blocks
(<= 16 real rows, padded to 16) always run the row-invariant int8 kernel, so
the rollback contract holds (benchmarks/NOTES.md, "CPU matmul kernels").

Few rows run muser's own int8 kernel (native.py, csrc/q8_linear.c: f32
accumulation, row- and thread-invariant, ~2x aten's `_weight_int8pack_mm` at
decode shapes) when it could be built; otherwise the aten kernels.  The choice
is made once per process, never per call.  The LM head (`out_float=True`)
returns float32 logits from the native kernel instead of rounding them to the
activation dtype.

q|k|v and gate|up are fused into one matrix each (per-row scales make the fused
int8 matrix identical to the stacked separate ones): fewer, larger calls.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from . import native
from .quant import QuantizedLinear, auto_kernel, linear as qlinear, quantize_rowwise_int8
from .weights import LayerWeights, Weights

DENSE_ROWS = 64


class FastLinear:
    __slots__ = ("q", "dense", "kernel", "out_float", "_scale", "_native")

    def __init__(self, q: QuantizedLinear, dense: torch.Tensor | None, out_float: bool = False):
        self.q, self.dense, self.out_float = q, dense, out_float
        self.kernel = "native" if native.available() else auto_kernel(q)
        self._native = native.BoundQ8(q.qweight, q.scale, q.in_scale) if self.kernel == "native" else None
        self._scale = q.scale.to(torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:       # x [T, K] -> [T, N]
        if self.dense is not None and x.shape[0] > DENSE_ROWS:
            return F.linear(x.to(self.dense.dtype), self.dense).to(x.dtype)
        if self.kernel == "native":
            return self._native(x, torch.float32 if self.out_float else x.dtype)
        if self.kernel == "int8_bf16" and self.q.in_scale is None:
            # The common decode call, without the generic dispatcher's reshapes.
            return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.q.qweight,
                                                      self._scale).to(x.dtype)
        return qlinear(x, self.q, kernel=self.kernel)

    def nbytes(self) -> int:
        return self.q.nbytes() + (0 if self.dense is None else self.dense.numel() * self.dense.element_size())


def _fast(w: torch.Tensor, equalize: bool = False, dense: bool = True, out_float: bool = False) -> FastLinear:
    q = quantize_rowwise_int8(w.float(), equalize=equalize)
    return FastLinear(q, w.to(torch.bfloat16).contiguous() if dense else None, out_float)


def quantize_weights(weights: Weights, embed_dtype: torch.dtype = torch.bfloat16) -> Weights:
    layers: list[LayerWeights] = []
    for lw in weights.layers:
        fuse_qkv = lw.bq is None and lw.bk is None and lw.bv is None
        fused = dict(
            wqkv=_fast(torch.cat([lw.wq, lw.wk, lw.wv])) if fuse_qkv else None,
            w_gate_up=_fast(torch.cat([lw.w_gate, lw.w_up])),
            wo=_fast(lw.wo), w_down=_fast(lw.w_down), w_gate=None, w_up=None,
        )
        if fuse_qkv:
            fused.update(wq=None, wk=None, wv=None)
        else:
            fused.update(wq=_fast(lw.wq), wk=_fast(lw.wk), wv=_fast(lw.wv))
        layers.append(replace(lw, **fused))
    # The LM head only ever sees the last row(s) of a chunk: no dense copy needed.
    head = _fast(weights.output, equalize=True, dense=False, out_float=True)
    return Weights(embed=weights.embed.to(embed_dtype), final_norm=weights.final_norm,
                   layers=layers, lm_head=head)
