"""Turning a float `Weights` into the CPU int8 fast path.

Owns: `quantize_weights(weights, embed_dtype)`: every projection matrix (q, k, v, o,
gate, up, down) and the LM head become `quant.QuantizedLinear` (int8, one scale per
output row); the embedding stays a float table for row lookups (only T rows are read
per step).  Does not own: the kernels (`quant.py`) or the choice of when to use
this (the engine's `quant=` setting, defaults.py).

Bytes per decode token for Gemma 3 270M: float32 ~1.07 GB + 0.67 GB LM head;
int8 ~0.17 GB + 0.17 GB LM head -- the LM head (262,144 x 640) is the largest
single read, which is why it is quantized with column equalization (its
outlier columns otherwise cost accuracy; see benchmarks/NOTES.md).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .quant import QuantizedLinear, quantize_rowwise_int8
from .weights import LayerWeights, Weights

PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _q(w: torch.Tensor, equalize: bool = False) -> QuantizedLinear:
    return quantize_rowwise_int8(w.float(), equalize=equalize)


def quantize_weights(weights: Weights, embed_dtype: torch.dtype = torch.bfloat16) -> Weights:
    layers: list[LayerWeights] = [replace(lw, **{n: _q(getattr(lw, n)) for n in PROJECTIONS})
                                  for lw in weights.layers]
    head = _q(weights.output, equalize=True)
    return Weights(embed=weights.embed.to(embed_dtype), final_norm=weights.final_norm,
                   layers=layers, lm_head=head)
