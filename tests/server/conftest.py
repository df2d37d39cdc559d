"""Fixtures for the black-box server tests: shared engines (loaded once) and servers."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny():
    """A random 6-layer Gemma-3-shaped model (window 4, max context 256), real BPE tokenizer."""
    from muser.testing import tiny_model
    return tiny_model()


@pytest.fixture(scope="session")
def gemma():
    """The embedded 270M model, with the CLI's default run settings for the CPU."""
    import muser
    try:
        from muser.backends.defaults import default_dtype, default_quant
        dtype = default_dtype("cpu")
        kw = {"quant": default_quant("cpu", dtype)}
    except ImportError:
        dtype, kw = "float32", {}
    return muser.load("gemma3-270m", device="cpu", dtype=dtype, **kw)


@pytest.fixture()
def tiny_server(tiny):
    from server_harness import serve
    with serve(tiny, model_id="tiny", slots=4, output_reserve=32) as srv:
        yield srv
