"""The CUDA backend: Triton kernels, captured decode steps, flash attention for chunks.

Owns: `CudaBackend` -- the chunk ops table (cuda/ops.py: Triton row kernels),
chunk attention (cuda/prefill.py: FlashAttention-2 with the window as a band,
`banded(...)`), and the step driver: decode-shaped steps (every session one
row, no padding) go through the graph runner (cuda/graph.py: host bookkeeping
per plane group, one captured step per batch size; the step itself in
cuda/decode_step.py with kernels in triton_ops.py and triton_decode.py), every
other shape through the one eager forward (backends/step.py).  The runner is
built on the first decode step and keeps the Env it was built with
(`reset_runner(env)` rebuilds it, for A/B runs of the decode knobs).
Every module here imports without Triton (the kernels import it lazily).
Does not own: plane bookkeeping (muser.cache: `Plane.advance`), the model maths.
"""
from __future__ import annotations

from ..base import Backend
from ..step import forward as one_forward
from . import triton_rows
from .ops import cuda_ops
from .prefill import CudaAttention


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, config, env):
        super().__init__(config, env)
        self.ops = cuda_ops(env.rows != "eager" and triton_rows.available())
        self.attention = CudaAttention()
        self._runner = None                  # None: not built yet; False: does not apply
        self._runner_env = env

    def runner(self, engine):
        """The GraphRunner for decode steps, or None (oracle family, unsupported model)."""
        if self._runner is None:
            from .graph import make_runner
            self._runner = make_runner(engine, self._runner_env) or False
        return self._runner or None

    def reset_runner(self, env=None) -> None:
        """Drop the runner; the next decode step builds one with `env` (default: the engine's)."""
        self._runner = None
        self._runner_env = env if env is not None else self.env

    def forward(self, engine, sessions, chunks, all_logits, pad, logits=True):
        if not pad and all(len(c) == 1 for c in chunks):
            runner = self.runner(engine)
            if runner is not None:           # one graph replay for every session
                return runner.decode(sessions, [c[0] for c in chunks])
        return one_forward(engine, sessions, chunks, all_logits, pad, logits)
