"""The CPU backend: native C kernels, int8 weights, the one eager forward.

Owns: `CpuBackend` -- the ops table (cpu/ops.py), the attention routes
(cpu/attention.py), turning loaded weights into the int8 fast path when
`quant="int8"` (model/quantize.py: int8 for few rows, a dense bf16 copy for
prefill chunks) and the facts the one forward needs: the int8 kernels are
row-invariant (a batched decode step equals each session alone, bit for bit),
and up to DENSE_ROWS rows every row-wise op is, so a padded chunk's matmuls may
skip its scratch rows.  Its step driver is backends/step.py.
Does not own: the kernels (model/native.py, model/quant.py, csrc/), which it
calls as black boxes.
"""
from __future__ import annotations

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
        # the int8 CPU kernel is row-invariant (measured, benchmarks/NOTES.md); bf16/f32 GEMMs are not
        self.row_invariant = config.quant == "int8"
        if self.row_invariant:
            from ...model.quantize import DENSE_ROWS
            self._dense_rows = DENSE_ROWS

    def prepare_weights(self, weights, dtype):
        if self.config.quant == "int8":
            from ...model.quantize import quantize_weights
            weights = quantize_weights(weights, embed_dtype=dtype)
            # with the native kernels every projection (a8w8) and the head are row-invariant at
            # any row count and attention reads keys by position: one arithmetic per token
            self.exact_rows = (bool(getattr(weights.lm_head, "exact_rows", False))
                               and self.attention.positional is not None)
        return weights

    def compact(self, padded_rows: int) -> bool:
        # more than DENSE_ROWS rows take the dense bf16 copy, which is not row-invariant
        return self.row_invariant and padded_rows <= self._dense_rows
