"""Shared fixtures: the embedded 270M model is loaded once per test session."""
import pytest


@pytest.fixture(scope="session")
def embedded():
    import muser
    return muser.load("gemma3-270m", dtype="float32", quant="none", progress=False)


@pytest.fixture(scope="session")
def gemma_default():
    """The embedded 270M model with the CPU defaults (bfloat16 activations + int8 weights)."""
    import muser
    return muser.load("gemma3-270m", progress=False)
