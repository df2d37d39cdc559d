"""MUSER_DOT_EARLY's host rule (backends/cuda/triton_dot_loads.early_fits): a projection's programs ask
the L2 for their weight rows only where every row slice is 16-byte aligned (the bulk prefetch
faults otherwise) and each row has a lane."""
import pytest

from muser.backends.cuda.triton_dot_loads import early_fits


@pytest.mark.parametrize("ptr,k,eb,ks,bn,glu,warps,fits", [
    (0x1000, 1152, 2, 1152, 32, False, 4, True),     # 1B qkv decode tile, bf16
    (0x1000, 1152, 2, 1152, 32, True, 4, True),      # gate|up: 64 rows in 128 lanes
    (0x1000, 6912, 2, 1024, 32, False, 4, True),     # down, split-K pieces of 1,024 keys
    (0x1000, 1152, 1, 1152, 32, False, 4, True),     # int8 rows: 1,152 bytes a row
    (0x1008, 1152, 2, 1152, 32, False, 4, False),    # a weight 8 bytes off the 16-byte grid
    (0x1000, 100, 2, 112, 32, False, 4, False),      # 200-byte rows: the second row is off it
    (0x1000, 1152, 2, 1004, 32, False, 4, False),    # pieces of 2,008 bytes
    (0x1000, 1160, 1, 1160, 32, False, 4, False),    # int8 rows of 1,160 bytes
    (0x1000, 1152, 2, 1152, 64, True, 2, False),     # 128 rows, 64 lanes
    (0x1000, 1152, 2, 1152, 64, False, 4, True),     # the head's 64-column tile
])
def test_rows_are_asked_for_only_on_the_16_byte_grid_with_a_lane_each(ptr, k, eb, ks, bn, glu,
                                                                        warps, fits):
    assert early_fits(ptr, k, eb, ks, bn, glu, warps) == fits
