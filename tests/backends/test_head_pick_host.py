"""Which decode steps pick in their head (backends/cuda/step_weights.head_picks, read once by
DecodeStep as `fused_pick`): the pipelined greedy graph's head keeps each tile's first maximum
instead of the logits only where the logits are the head's values.  The pick's bits are the
kernel tests' to pin (tests/cuda/test_triton_pick.py); this pins the choice."""
from types import SimpleNamespace

import pytest
import torch

from muser.backends.cuda.step_weights import head_picks
from muser.backends.cuda.weights_int8 import RowInt8

DOT = ("qkv", "o", "down", "gu", "head")            # MUSER_GEMV=dot, the default
FAST = ("qkv", "o", "down", "gu")                   # MUSER_GEMV=fast: the head through cuBLAS
ROWS = torch.zeros(8, 4)
INT8 = RowInt8(torch.zeros(8, 4, dtype=torch.int8), torch.ones(8))


@pytest.mark.parametrize("what,scale,cap,output,gemv_for,picks", [
    ("Gemma 3", 1.0, None, ROWS, DOT, True),
    ("Gemma 3, int8 rows", 1.0, None, INT8, FAST, True),
    ("Cohere2: a logit scale", 0.0625, None, ROWS, DOT, False),
    ("Gemma 2: a final soft-cap", 1.0, 30.0, ROWS, DOT, False),
    ("MUSER_GEMV=fast", 1.0, None, ROWS, FAST, False),
    ("a head that is a view across rows", 1.0, None, ROWS.t(), DOT, False),
])
def test_a_head_picks_only_where_the_logits_are_its_values(what, scale, cap, output, gemv_for,
                                                           picks):
    spec = SimpleNamespace(logit_scale=scale, final_logit_softcap=cap)
    assert head_picks(spec, output, gemv_for) is picks, what
