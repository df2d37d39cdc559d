"""MUSER_DOT_AHEAD's host side, without a GPU (backends/cuda/triton_dot_ahead.py): which calls
the weights-ahead tile takes -- only those where it gives dot_rows' bits (a decode tile, 16-bit
weights of the rows' dtype, no split-K pieces, a slab a program can hold, K in at most nine
parts of 128 keys) -- and that a call it does not take is refused, not computed otherwise.  The bits are
tests/cuda/test_dot_ahead.py's."""
import pytest
import torch

from muser.backends.cuda.triton_dot_ahead import SLAB, ahead_takes, dot_ahead

BF, F16 = torch.bfloat16, torch.float16
TAKES = [  # (n, k, glu, rows, weight dtype, rows' dtype) -> taken
    ((1536, 640, False, 1, BF, BF), True),        # the 270M's qkv
    ((640, 1024, False, 16, BF, BF), True),       # its o, 16 sessions
    ((2048, 640, True, 1, BF, BF), False),        # its gate|up: both slabs spill
    ((1536, 1152, False, 1, BF, BF), True),       # the 1B's qkv (1,024 + 128 keys)
    ((640, 1024, False, 17, BF, BF), False),      # past one 16-row tile
    ((640, 2048, False, 1, BF, BF), False),       # the 270M's down: a slab of 65,536
    ((6912, 1152, True, 1, BF, BF), False),       # the 1B's gate|up: 73,728
    ((1152, 6912, False, 1, BF, BF), False),      # the 1B's down: split-K pieces
    ((1536, 640, False, 1, torch.int8, BF), False),   # int8 rows
    ((1536, 640, False, 1, BF, F16), False),      # weights not of the rows' dtype
    ((1536, 640, False, 1, torch.float32, torch.float32), False),
    ((1536, 1100, False, 1, BF, BF), False),      # not a multiple of 128 keys
    ((512, 1280, False, 1, BF, BF), False),       # ten parts of 128 keys: past the kernel's nine
]


@pytest.mark.parametrize("args,want", TAKES)
def test_ahead_takes_only_the_calls_it_computes_as_dot_rows_does(args, want):
    n, k, glu, rows, wdt, xdt = args
    assert ahead_takes(n, k, glu, rows, torch.empty(0, dtype=wdt), xdt) is want


def test_a_call_it_does_not_take_is_refused_naming_it():
    w = torch.zeros(2 * 6912, 1152, dtype=BF)
    with pytest.raises(ValueError, match=rf"at most {SLAB} weights in parts of 128 keys, got \[6912, 1152\]"):
        dot_ahead(torch.zeros(1, 1152, dtype=BF), w, glu=True)
