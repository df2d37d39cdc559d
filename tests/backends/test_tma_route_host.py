"""MUSER_DOT_TMA=auto: which projections' 128-row chunk tiles load by TMA (no GPU needed).

`tma_pays` takes the weights of 4M elements or more: on the H200 the 1B's gate|up and down
carried ~92% of the TMA tiles' gain, while the 270M -- every weight under 2.7M elements -- is
host-bound at 16k rows and lost 2-8% with every tile on TMA (benchmarks/RESULTS.md,
twenty-second session).  The bits do not depend on the route (tests/cuda/test_triton_ops.py)."""
import pytest

from muser.backends.cuda.triton_dot_tiles import TMA_AUTO_WEIGHT, tma_pays


@pytest.mark.parametrize("what,rows,k,takes", [
    ("1B gate|up", 2 * 6912, 1152, True), ("1B down", 1152, 6912, True),
    ("1B qkv", 1536, 1152, False), ("1B o", 1152, 1024, False),
    ("270M gate|up", 2 * 2048, 640, False), ("270M down", 640, 2048, False),
    ("270M qkv", 1536, 640, False), ("270M o", 640, 1024, False),
    ("4B o", 2560, 2048, True), ("4B qkv", 4096, 2560, True),
])
def test_auto_takes_tma_tiles_only_for_large_weights(what, rows, k, takes):
    assert tma_pays(rows * k) is takes, what


def test_the_auto_bound_is_inclusive():
    assert tma_pays(TMA_AUTO_WEIGHT) and not tma_pays(TMA_AUTO_WEIGHT - 1)
