"""Turning a float `Weights` into the CPU fast path: int8 weights, fused projections.

Owns: `FastLinear` (a projection with int8 weights, the kernel it runs for any row count) and
`quantize_weights`.  Does not own: the kernels (`native.py` + csrc/, `quant.py`) or when the
path is used (the engine's `quant=` setting, backends/defaults.py; backends/cpu).

One arithmetic per token (issue 12): with the native kernels built, every projection -- a
decode row, a verification block, a 512-row prefill chunk, a batched step -- runs one kernel,
csrc/a8w8.c: the row quantized to two int8 planes (~15-bit activations), exact int32 sums on
AVX512-VNNI, an element-wise epilogue.  Integer sums do not depend on tiling, row count or
thread count, so a token's projections are bit-identical however it is computed, and the
kernel is as fast as oneDNN's bf16 GEMM at 512 rows and faster than the old f32 GEMV at 1-16
(benchmarks/NOTES.md, "One arithmetic per token").  The LM head (`out_float=True`, column-
equalized, only ever <= 16 rows: decode, verification, a chunk's last row) keeps the f32-
activation int8 GEMV (csrc/q8_linear.c, row-invariant): its accuracy is what greedy depends
on most.

Without the native kernels (no compiler, MUSER_NATIVE=0) the aten kernels run, with a dense
bf16 copy for chunks of more than DENSE_ROWS rows (oneDNN is ~4x aten's int8 kernel there);
that fallback is deterministic but not row-invariant.

q|k|v and gate|up are fused into one matrix each (per-row scales make the fused int8 matrix
identical to the stacked separate ones): fewer, larger calls.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from . import native
from .quant import QuantizedLinear, auto_kernel, linear as qlinear, quantize_rowwise_int8
from .weights import LayerWeights, MoeWeights, Weights

DENSE_ROWS = 64


class FastLinear:
    __slots__ = ("q", "dense", "kernel", "out_float", "_scale", "_native")

    def __init__(self, q: QuantizedLinear, dense: torch.Tensor | None, out_float: bool = False):
        self.q, self.out_float = q, out_float
        self._scale = q.scale.to(torch.bfloat16)
        if not native.available():
            self.kernel, self._native, self.dense = auto_kernel(q), None, dense
        elif out_float or q.in_scale is not None:
            self.kernel, self.dense = "native", None
            self._native = native.BoundQ8(q.qweight, q.scale, q.in_scale)
        else:
            self.kernel, self.dense = "a8w8", None
            self._native = native.BoundA8W8(q.qweight, q.scale)
            self.q = None                     # the packed copy is all the kernel reads

    @property
    def exact_rows(self) -> bool:
        """Whether row i of any call is bitwise the one-row call (every native kernel is)."""
        return self._native is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:       # x [T, K] -> [T, N]
        if self._native is not None:
            return self._native(x, torch.float32 if self.out_float else x.dtype)
        if self.dense is not None and x.shape[0] > DENSE_ROWS:
            return F.linear(x.to(self.dense.dtype), self.dense).to(x.dtype)
        if self.kernel == "int8_bf16" and self.q.in_scale is None:
            # The common decode call, without the generic dispatcher's reshapes.
            return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.q.qweight,
                                                      self._scale).to(x.dtype)
        return qlinear(x, self.q, kernel=self.kernel)

    def nbytes(self) -> int:
        if self.kernel == "a8w8":
            return self._native.nbytes()
        return self.q.nbytes() + (0 if self.dense is None else self.dense.numel() * self.dense.element_size())


def _fast(w: torch.Tensor, equalize: bool = False, dense: bool = True, out_float: bool = False) -> FastLinear:
    q = quantize_rowwise_int8(w.float(), equalize=equalize)
    keep_dense = dense and not native.available()          # only the aten fallback uses it
    return FastLinear(q, w.to(torch.bfloat16).contiguous() if keep_dense else None, out_float)


def _quantize_moe(mw: MoeWeights) -> MoeWeights:
    """Experts like every other projection (int8, gate|up fused), never with the aten
    fallback's dense bf16 copy: a chunk spreads its rows over the experts (512 rows x top-4 /
    32 experts ~ 64 per expert), and a 20B-class model's experts would double in memory.  The
    router is int8 too (row-invariant routing: a token picks the same experts alone or batched)."""
    return replace(mw, router=_fast(mw.router, dense=False),
                   w_gate_up=[_fast(torch.cat([g, u]), dense=False) for g, u in zip(mw.w_gate, mw.w_up)],
                   w_down=[_fast(d, dense=False) for d in mw.w_down], w_gate=None, w_up=None)


def quantize_weights(weights: Weights, embed_dtype: torch.dtype = torch.bfloat16) -> Weights:
    layers: list[LayerWeights] = []
    for lw in weights.layers:
        fused: dict = {"wo": _fast(lw.wo)}
        proj = [w for w in (lw.wq, lw.wk, lw.wv) if w is not None]     # KV-shared: q only; V = K: q|k
        if lw.bq is None and lw.bk is None and lw.bv is None:
            fused.update(wqkv=_fast(torch.cat(proj)), wq=None, wk=None, wv=None)
        else:
            fused.update(wq=_fast(lw.wq), wk=None if lw.wk is None else _fast(lw.wk),
                         wv=None if lw.wv is None else _fast(lw.wv))
        if lw.w_gate is not None:                                        # dense MLP (not gpt-oss)
            fused.update(w_gate_up=_fast(torch.cat([lw.w_gate, lw.w_up])), w_down=_fast(lw.w_down),
                         w_gate=None, w_up=None)
        if lw.moe is not None:
            fused["moe"] = _quantize_moe(lw.moe)
        if lw.ple_gate is not None:
            fused.update(ple_gate=_fast(lw.ple_gate), ple_proj=_fast(lw.ple_proj))
        layers.append(replace(lw, **fused))
    # The LM head only ever sees the last row(s) of a chunk: no dense copy needed.
    head = _fast(weights.output, equalize=True, dense=False, out_float=True)
    return Weights(embed=weights.embed.to(embed_dtype), final_norm=weights.final_norm,
                   layers=layers, lm_head=head,
                   per_layer_embed=None if weights.per_layer_embed is None else weights.per_layer_embed.to(embed_dtype),
                   per_layer_proj=None if weights.per_layer_proj is None else _fast(weights.per_layer_proj),
                   per_layer_norm=weights.per_layer_norm)
