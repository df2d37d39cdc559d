"""Helpers for the CUDA tests: run on a GPU; skip cleanly elsewhere (CI is CPU-only).

Kernel tests also run on the CPU under Triton's interpreter when
MUSER_TRITON_INTERPRET=1 (float16: the interpreter has no bfloat16), which is
how they were checked before any GPU time was spent.  Engine tests (graphs,
flash attention) need a real GPU.
"""
import os

import pytest
import torch

from muser.env import read as read_env

INTERPRET = read_env().triton_interpret
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

HAS_CUDA = torch.cuda.is_available()


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_kernels = pytest.mark.skipif(not (HAS_CUDA or (INTERPRET and triton_available())),
                                   reason="needs a CUDA GPU (or MUSER_TRITON_INTERPRET=1 with triton)")


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


PROMPT = [7, 3, 99, 41, 5, 5, 18, 200, 11, 64, 3, 9, 120, 77]


def prefill_then_decode(engine, extend=()) -> torch.Tensor:
    """One session's logits, stacked: a prefill of PROMPT, seven decode steps (graph replays on
    CUDA), then an `extend` if given (its last row) -- what an engine-level A/B of two runner
    settings compares bitwise."""
    s, out = engine.new_session(), []
    out.append(s.prefill(PROMPT).reshape(1, -1))
    for t in (5, 17, 250, 3, 8, 8, 99):
        out.append(s.decode(t).reshape(1, -1))
    if extend:
        out.append(s.extend(list(extend))[-1:])
    return torch.cat(out)
