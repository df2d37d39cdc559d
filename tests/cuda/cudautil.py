"""Helpers for the CUDA tests: run on a GPU; skip cleanly elsewhere (CI is CPU-only).

Kernel tests (marked `kernels`: `needs_kernels`) also run on the CPU under Triton's
interpreter (float16: the interpreter has no bfloat16), which is how they are checked before
any GPU time is spent.  Without a GPU but with Triton installed (the test extra installs it),
the ones also marked `interp` -- one or a few cheap rows a kernel -- run there in every test
run, CI included; all of them with MUSER_TRITON_INTERPRET=1 (tens of minutes on 2 cores).
conftest.py's `pytest_collection_modifyitems` applies the rule.  Engine tests (graphs, flash
attention) need a real GPU (`needs_gpu`).
"""
import importlib.util
import os

import pytest
import torch

from muser.env import read as read_env

HAS_CUDA = torch.cuda.is_available()


def triton_available() -> bool:
    """Whether Triton is installed -- found, not imported: Triton reads TRITON_INTERPRET when
    it is imported, so the check below must not import it before setting that."""
    return importlib.util.find_spec("triton") is not None


# every kernel test, not only the `interp` ones (MUSER_TRITON_INTERPRET=1)
INTERPRET_ALL = read_env().triton_interpret
# No GPU, Triton installed: Triton's kernels can only run under its interpreter here.  Set when
# the root conftest imports this module, before any test module can import Triton.
INTERPRET = not HAS_CUDA and (INTERPRET_ALL or os.environ.get("TRITON_INTERPRET") == "1"
                              or triton_available())
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_kernels = pytest.mark.kernels          # what runs where: conftest.pytest_collection_modifyitems


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
