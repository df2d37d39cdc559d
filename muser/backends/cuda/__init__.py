"""The CUDA backend: Triton kernels, captured decode steps, flash attention for chunks.

Owns: `CudaBackend` -- the step driver: decode-shaped steps (every session one
row, no padding) go through the graph runner (cuda/graph.py: host bookkeeping
per plane group, one captured step per batch size; the step itself in
cuda/decode_step.py with kernels in triton_*.py); every other shape (prefill
chunks, verification blocks) through the same step's kernels, uncaptured
(cuda/chunk_step.py: one arithmetic per token, `exact_rows`), inside the one
forward's transaction (backends/step.py).  With MUSER_CHUNKS=fast, or for a
model the step does not support, chunks take the eager forward with the chunk
ops table (cuda/ops.py: Triton row kernels, cuBLAS) and FlashAttention
(cuda/prefill.py, `banded(...)`): faster prefill, rows that differ from decoded
ones in the last bits.  The runner is built on first use and keeps the Env it
was built with (`reset_runner(env)` rebuilds it, for A/B runs of the knobs).
Every module here imports without Triton (the kernels import it lazily).
Does not own: plane bookkeeping (muser.cache: `Plane.advance`), the model maths.
"""
from __future__ import annotations

import sys

from ..base import Backend
from ..step import forward as one_forward
from . import triton_rows
from .ops import cuda_ops
from .prefill import CudaAttention


def arithmetic_tag(env) -> str:
    """"+cuda-<6 hex>": the exact path's arithmetic (triton_attn.ARITHMETIC, the attention
    layouts' bits fields at both head-dim classes, the projections' split-K pieces where the
    tile table departs from the rule, the decode knobs that change bits).  Two engines share a
    tag only if a row computed by one is bitwise the row the other computes."""
    import hashlib
    import json
    from .triton_attn import ARITHMETIC, BITS_FIELDS, layout
    from .triton_dot_tiles import table_pieces
    lays = [[layout(growing, d, env)[k] for k in BITS_FIELDS]
            for growing in (False, True) for d in (64, 256)]
    pieces = table_pieces()
    # MUSER_DOT_CPP claims dot_rows' bits but no GPU has checked it yet: its cuts get a tag of
    # their own until one has (fail closed; off -- the default -- leaves the tag as it was)
    cpp = [env.dot_cpp] if env.dot_cpp != "off" else []
    blob = json.dumps([ARITHMETIC, lays, pieces, env.gemv, env.attn] + cpp)
    return "+cuda-" + hashlib.sha256(blob.encode()).hexdigest()[:6]


class CudaBackend(Backend):
    name = "cuda"
    # H200, Gemma-3-1B shape at 2k (benchmarks/verify_cost.py, chunk graphs on, MUSER_CHUNK_PARK
    # 16): a 1-16 row verification block 2.0-2.7 ms against a decode step + rollback of 1.3 ms
    # (5.5 ms with the splits walked in one program: 3.7 steps)
    verify_cost = 2.0

    def __init__(self, config, env):
        super().__init__(config, env)
        self.ops = cuda_ops(env.rows != "eager" and triton_rows.available())
        self.attention = CudaAttention()
        self._runner = None                  # None: not built yet; False: does not apply
        self._runner_env = env
        # cuts carry the arithmetic that made them: fast chunks compute rows that differ from
        # decoded ones; the exact path is named by its version and bits knobs (arithmetic_tag)
        self.encoding_tag = "+fast-chunks" if env.chunks == "fast" else arithmetic_tag(env)
        if config.quant == "int8":           # int8 rows' own arithmetic (int8-head's rows are bf16's)
            from .weights_int8 import INT8_ROWS
            self.encoding_tag += f"+i{INT8_ROWS}"

    def check_model(self, spec, weights) -> None:
        if self.config.quant != "none":
            from ...errors import ModelFormatError
            from .weights_int8 import why_not_int8
            why = why_not_int8(spec, weights, self.env)
            if why:
                raise ModelFormatError(f"quant={self.config.quant!r} on CUDA needs {why}")

    def prepare_weights(self, weights, dtype):
        """int8: every projection and the head as int8 rows; int8-head / int8-head-fast: the
        head alone (weights_int8.py); else as loaded."""
        if self.config.quant != "none":
            from .weights_int8 import quantize_weights
            quantize_weights(weights, self.config.quant)
        return weights

    def runner(self, engine):
        """The GraphRunner for decode steps, or None (oracle family, unsupported model)."""
        if self._runner is None:
            from .graph import make_runner
            self._runner = make_runner(engine, self._runner_env) or False
            # every row through the step's kernels: one arithmetic per token (issue 12)
            self.exact_rows = (bool(self._runner) and self._runner_env.chunks == "exact"
                               and self._runner.step.invariant)
            self.invariant_rows = sys.maxsize if self.exact_rows else 0
        return self._runner or None

    def runner_stats(self) -> dict:
        return dict(self._runner.stats) if self._runner else {}

    def reset_runner(self, env=None) -> None:
        """Drop the runner; the next step builds one with `env` (default: the engine's)."""
        self._runner = None
        self._runner_env = env if env is not None else self.env
        self.exact_rows, self.invariant_rows = False, 0

    def greedy(self, engine, sessions, run):
        """Through the graph runner with the host one step ahead (cuda/greedy.py,
        MUSER_PIPELINE), else one step at a time."""
        runner = self.runner(engine)
        if runner is not None and self._runner_env.pipeline == "on":
            return runner.greedy(sessions, run)
        return super().greedy(engine, sessions, run)

    def greedy_steps(self, engine):
        """The graph runner's greedy steps (cuda/greedy.py), where it runs."""
        runner = self.runner(engine)
        if runner is None:
            return None
        from .greedy import GreedySteps
        return GreedySteps(runner)

    @property
    def pipeline_default(self) -> bool:
        return self._runner_env.pipeline == "on"

    def forward(self, engine, sessions, chunks, all_logits, pad, logits=True):
        runner = self.runner(engine)
        if runner is not None:
            if not pad and all(len(c) == 1 for c in chunks):
                return runner.decode(sessions, [c[0] for c in chunks])   # one graph replay
            if self.exact_rows:
                return one_forward(engine, sessions, chunks, all_logits, pad, logits,
                                   pass_fn=runner.chunk_pass)
        return one_forward(engine, sessions, chunks, all_logits, pad, logits)
