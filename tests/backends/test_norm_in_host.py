"""Which projections may norm their own rows (MUSER_NORM_IN; backends/cuda/decode_step
`_takes_norm`, triton_dot_norm.norm_fuses): only a bf16 dot_rows whose tile has add_norm's
warps for the width (the reduction's tree) and FMA contraction on, in a step of at most N rows.
The kernel's bits are the GPU tests' to pin (tests/cuda/test_triton_ops.py, test_norm_in.py);
this pins the choice, on the CPU."""
from types import SimpleNamespace

import pytest
import torch

from muser.backends.cuda.decode_step import DecodeStep
from muser.backends.cuda.triton_dot import dot_rows
from muser.backends.cuda.triton_dot_norm import norm_fuses
from muser.backends.cuda.weights_int8 import RowInt8

DOT = ("qkv", "o", "down", "gu", "head")


def step(rows: int, gemv=dot_rows, gemv_for=DOT):
    return SimpleNamespace(norm_in_rows=rows, gemv=gemv, gemv_for=gemv_for, batch1_only=False)


def takes(s, what, w, R):
    return DecodeStep._takes_norm(s, what, w, R)


@pytest.mark.parametrize("what,proj,shape,R,rows,want", [
    ("270M qkv, one row", "qkv", (1536, 640), 1, 1, True),
    ("270M gate|up, 16 rows", "gu", (4096, 640), 16, 16, True),
    ("1B qkv", "qkv", (1536, 1152), 1, 1, True),
    ("1B gate|up, 4 rows", "gu", (13824, 1152), 4, 4, True),
    ("more rows than N", "qkv", (1536, 640), 2, 1, False),
    ("off", "qkv", (1536, 640), 1, 0, False),
    ("4B qkv: add_norm takes 8 warps at 2,560, the tile 4", "qkv", (4096, 2560), 1, 16, False),
])
def test_a_projection_norms_its_rows_only_where_it_can_norm_as_add_norm(what, proj, shape, R,
                                                                        rows, want):
    assert takes(step(rows), proj, torch.zeros(shape, dtype=torch.bfloat16), R) is want, what


@pytest.mark.parametrize("why,s,w", [
    ("int8 rows: compiled without FMA contraction", step(16),
     RowInt8(torch.zeros(1536, 640, dtype=torch.int8), torch.ones(1536))),
    ("MUSER_GEMV=fast: not dot_rows", step(16, gemv=lambda *a, **k: None),
     torch.zeros(1536, 640)),
    ("the projection not through dot_rows", step(16, gemv_for=("o", "down")),
     torch.zeros(1536, 640)),
    ("a weight view across rows", step(16), torch.zeros(640, 1536).t()),
])
def test_no_norm_is_left_to_a_projection_that_cannot_take_it(why, s, w):
    assert takes(s, "qkv", w, 1) is False, why


def test_a_tile_norms_only_at_add_norms_warps_and_with_bf16_weights():
    assert norm_fuses(640, 4, False) and norm_fuses(1152, 4, False)
    assert not norm_fuses(640, 8, False) and not norm_fuses(640, 4, True)
    assert norm_fuses(2560, 8, False) and not norm_fuses(2560, 4, False)
