"""Fixtures for the CUDA tests (helpers and skip marks live in cudautil.py)."""
import pytest
import torch
from cudautil import HAS_CUDA


@pytest.fixture
def dev():
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def kdtype():
    """The cache/activation dtype the kernels run in (bfloat16 on a GPU)."""
    return torch.bfloat16 if HAS_CUDA else torch.float16
