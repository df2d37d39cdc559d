"""The CPU backend: native C kernels, int8 weights, the one eager forward.

Owns: `CpuBackend` -- the ops table (cpu/ops.py), the attention routes
(cpu/attention.py: the positional kernel when the native kernels are built),
turning loaded weights into the int8 fast path when `quant="int8"`
(model/quantize.py) and the facts the one forward needs.  With the native
kernels the int8 path is one arithmetic per token (`exact_rows`: a8w8
projections for any row count, the row-invariant head, positional attention):
no scratch rows, and any number of sessions share a pass, each row bitwise
what it is alone.  Without them (MUSER_NATIVE=0, no compiler) the aten int8
kernels are row-invariant up to DENSE_ROWS rows (`invariant_rows`; more take a
dense bf16 copy): a batched step shares passes of up to 64 rows and a padded
chunk's matmuls skip its scratch rows.  Its step driver is backends/step.py.
Does not own: the kernels (model/native.py, model/quant.py, csrc/), which it
calls as black boxes.
"""
from __future__ import annotations

import sys

from ...model import native
from ..base import Backend
from .attention import CpuAttention
from .ops import cpu_ops


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, config, env):
        super().__init__(config, env)
        self.native = env.native and native.available()
        self.ops = cpu_ops(self.native)
        self.attention = CpuAttention()
        # the int8 CPU kernel is row-invariant (measured, benchmarks/NOTES.md); bf16/f32 GEMMs
        # are not; without the native kernels more than DENSE_ROWS rows take a dense bf16 copy
        if config.quant == "int8":
            from ...model.quantize import DENSE_ROWS
            self.invariant_rows = DENSE_ROWS

    def prepare_weights(self, weights, dtype):
        if self.config.quant == "int8":
            from ...model.quantize import quantize_weights
            weights = quantize_weights(weights, embed_dtype=dtype)
            # with the native kernels every projection (a8w8) and the head are row-invariant at
            # any row count and attention reads keys by position: one arithmetic per token
            if getattr(weights.lm_head, "exact_rows", False) and self.attention.positional is not None:
                self.exact_rows, self.invariant_rows = True, sys.maxsize
                self.shared_chunks = True
        return weights
