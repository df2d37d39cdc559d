"""Fixtures for the cut-store tests: tiny real models on the float32 path and on the default CPU
path (bfloat16 activations + int8 weights), and deterministic token ids."""
from __future__ import annotations

import pytest

from store_ids import BLOCK, WINDOW, ids  # noqa: F401  (a unique module name: tests/server has a conftest too)


@pytest.fixture(scope="session", params=["float32", "default"])
def engine(request):
    """The tiny Gemma-3-shaped model on both CPU paths."""
    from muser.testing import tiny_model
    if request.param == "default":
        return tiny_model(window=WINDOW, tokenizer=False, dtype="bfloat16", quant="int8")
    return tiny_model(window=WINDOW, tokenizer=False)


@pytest.fixture(scope="session")
def f32():
    from muser.testing import tiny_model
    return tiny_model(window=WINDOW, tokenizer=False)
