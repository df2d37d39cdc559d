"""Shared fixtures: the embedded 270M model is loaded once per test session.

Also imports tests/cuda/cudautil.py first thing: it decides whether Triton's kernels run under
its interpreter (no GPU) and sets TRITON_INTERPRET, which Triton reads when it is imported --
so before any test module, in any folder, can import Triton."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "cuda"))
import cudautil  # noqa: E402,F401  (for its side effect: see above)


@pytest.fixture(scope="session")
def embedded():
    import muser
    return muser.load("gemma3-270m", dtype="float32", quant="none", progress=False)


@pytest.fixture(scope="session")
def gemma_default():
    """The embedded 270M model with the CPU defaults (bfloat16 activations + int8 weights)."""
    import muser
    return muser.load("gemma3-270m", progress=False)
