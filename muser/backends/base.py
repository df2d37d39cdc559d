"""What a backend is: the device's wing of an engine, chosen once per Engine.

Owns: `Backend`, the interface every backend implements -- an ops table for the
model maths (`model.ops.Ops`), an attention function, weight
preparation, the row-invariance facts the one forward needs, and `forward`,
the step driver (by default the one eager forward, backends/step.py).
Does not own: choosing a backend (backends/__init__.py: `select`), the maths
itself (muser.model.transformer) or plane storage (muser.cache).
"""
from __future__ import annotations

import torch

from ..config import EngineConfig
from ..env import Env
from ..model.ops import EAGER, Ops
from .step import forward as one_forward


class Backend:
    """A device's ops, attention and step driver for one engine.

    name            "reference" | "cpu" | "cuda"
    ops             the element-wise pieces of a layer (model.ops.Ops)
    attention       (q [T,H,D], k [S,KV,D], v [S,KV,D], mask bool [T,S] | None, scale, softcap)
                    -> [T,H,D]; may also offer `banded(q, k, v, q_start, k_start, window, scale,
                    softcap)`, the window rule as positions (flash attention without a mask)
    invariant_rows  up to this many rows in one pass, every row-wise op (the matmuls above all)
                    computes each row bit for bit as it would alone: sessions may share a pass
                    and a chunk's matmuls may skip its scratch rows (backends/step.py); 0: none
    exact_rows      every op, attention included, computes a row the same way whatever shares
                    the pass and however many rows it has -- one arithmetic per token: chunks
                    need no scratch rows (issue 12)
    encoding_tag    appended to the engine's cut-encoding family when the backend's rows differ
                    from the plain family's (CUDA: "+cuda-<arithmetic digest>", "+fast-chunks")
    verify_cost     a verification block's cost in decode steps (speculation pays only above that
                    many tokens settled per round; 1: as cheap as a step -- the CPU)
    shared_chunks   several sessions' chunks in one pass cost less than a pass each, with every
                    row exact (CPU int8: the weights are read once for all rows; CUDA: False --
                    one session's chunk replays a captured graph, several run eagerly, and which
                    wins from how many sessions on is not measured yet)
    """

    name = "?"
    encoding_tag = ""                # appended to the cut encoding's family: the backend's arithmetic
    ops: Ops = EAGER
    invariant_rows = 0
    exact_rows = False
    shared_chunks = False
    verify_cost = 1.0

    def __init__(self, config: EngineConfig, env: Env):
        self.config, self.env = config, env

    attention = None                 # set per instance (a plain function or a callable object)

    def check_model(self, spec, weights) -> None:
        """Refuse, before anything is prepared, a model this backend cannot run as configured
        (a typed error naming what it needs); default: every model runs."""

    def prepare_weights(self, weights, dtype: torch.dtype):
        """The engine's weights in the form this backend runs them (default: as loaded)."""
        return weights

    def runner(self, engine):
        """The captured decode-step runner, or None (only CUDA has one)."""
        return None

    def runner_stats(self) -> dict:
        """The decode runner's counters (captures, capture_seconds, replays, eager, ...) once it
        is built; {} before, and on backends without one.  Never builds it."""
        return {}

    def greedy(self, engine, sessions, run):
        """A checked greedy run (backends/greedy.py: `Budget`) -> `Greedy`; by default one
        step at a time through `forward`."""
        from .greedy import decode_loop
        return decode_loop(engine, sessions, run)

    def greedy_steps(self, engine):
        """A pipeline of greedy steps (launch / collect / take_back), or None: none pays here."""
        return None

    # whether the engine's own greedy loops (decode_greedy, stream) take `greedy_steps`
    pipeline_default = False

    def forward(self, engine, sessions, chunks, all_logits: bool, pad: bool,
                logits: bool = True) -> torch.Tensor:
        """The step driver: `chunks[b]` (validated token ids) through every layer for
        `sessions[b]`; float32 logits (see backends/step.py)."""
        return one_forward(engine, sessions, chunks, all_logits, pad, logits)
