"""What a backend is: the device's wing of an engine, chosen once per Engine.

Owns: `Backend`, the interface every backend implements -- an ops table for the
model maths (`model.transformer.Ops`), an attention function, weight
preparation, the row-invariance facts the one forward needs, and `forward`,
the step driver (by default the one eager forward, backends/step.py).
Does not own: choosing a backend (backends/__init__.py: `select`), the maths
itself (muser.model.transformer) or plane storage (muser.cache).
"""
from __future__ import annotations

import torch

from ..config import EngineConfig
from ..env import Env
from ..model.transformer import EAGER, Ops
from .step import forward as one_forward


class Backend:
    """A device's ops, attention and step driver for one engine.

    name            "reference" | "cpu" | "cuda"
    ops             the element-wise pieces of a layer (model.transformer.Ops)
    attention       (q [T,H,D], k [S,KV,D], v [S,KV,D], mask bool [T,S] | None, scale, softcap)
                    -> [T,H,D]; may also offer `banded(q, k, v, q_start, k_start, window, scale,
                    softcap)`, the window rule as positions (flash attention without a mask)
    row_invariant   a row of a batched matmul equals the one-row matmul bit for bit, so
                    sessions may share a step's matmuls (and a chunk's matmuls may skip its
                    scratch rows, see `compact`)
    exact_rows      every op, attention included, computes a row the same way whatever shares
                    the pass and however many rows it has -- one arithmetic per token: chunks
                    need no scratch rows (issue 12)
    """

    name = "?"
    ops: Ops = EAGER
    row_invariant = False
    exact_rows = False

    def __init__(self, config: EngineConfig, env: Env):
        self.config, self.env = config, env

    attention = None                 # set per instance (a plain function or a callable object)

    def prepare_weights(self, weights, dtype: torch.dtype):
        """The engine's weights in the form this backend runs them (default: as loaded)."""
        return weights

    def compact(self, padded_rows: int) -> bool:
        """Whether a step whose chunks are padded to `padded_rows` rows in all may run
        everything but attention on its real rows only (its scratch rows enter attention as
        zeros): only when every row-wise op is row-invariant at that row count."""
        return False

    def runner(self, engine):
        """The captured decode-step runner, or None (only CUDA has one)."""
        return None

    def forward(self, engine, sessions, chunks, all_logits: bool, pad: bool) -> torch.Tensor:
        """The step driver: `chunks[b]` (validated token ids) through every layer for
        `sessions[b]`; float32 logits (see backends/step.py)."""
        return one_forward(engine, sessions, chunks, all_logits, pad)
