"""Fixtures for the CUDA tests (helpers and skip marks live in cudautil.py), and where a kernel
test runs: on a GPU always; without one, under Triton's interpreter -- the `interp` ones
wherever Triton is installed, every one with MUSER_TRITON_INTERPRET=1."""
import pytest
import torch
from cudautil import HAS_CUDA, INTERPRET, INTERPRET_ALL, triton_available


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    if not (INTERPRET and triton_available()):
        why = "needs a CUDA GPU (or Triton, for its interpreter: pip install -e '.[test]')"
        interp_runs = False
    elif INTERPRET_ALL:
        return
    else:
        why, interp_runs = ("slow under Triton's interpreter: MUSER_TRITON_INTERPRET=1 runs it "
                            "(every run takes the ones marked interp)"), True
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if item.get_closest_marker("kernels") and not (
                interp_runs and item.get_closest_marker("interp")):
            item.add_marker(skip)


@pytest.fixture
def dev():
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def kdtype():
    """The cache/activation dtype the kernels run in (bfloat16 on a GPU)."""
    return torch.bfloat16 if HAS_CUDA else torch.float16
