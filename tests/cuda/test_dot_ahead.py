"""MUSER_DOT_AHEAD (backends/cuda/triton_dot_ahead.py): a small projection whose weight slab is
loaded before the PDL wait gives dot_rows' decode-tile bits -- plain, at 1,
5 and 16 rows, PDL off and on, the 270M's and the 1B's shapes it takes -- and an engine with it
prefills, decodes, extends and batches bit for bit as without.  Under Triton's interpreter
(no GPU) the kernel's logic is checked against dot_rows closely, not bitwise: the
interpreter's dot is numpy's, whose summation order follows the operand's length."""
import pytest
import torch
from cudautil import HAS_CUDA, needs_gpu, needs_kernels

from muser.env import Env
from muser.testing import tiny_model

pytestmark = needs_kernels

# (n, k, glu): the 270M's qkv and o, the 1B's qkv and o
SHAPES = [(1536, 640, False), (640, 1024, False), (1536, 1152, False), (1152, 1024, False)]


def _pair(n, k, glu, rows, dev, dt, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(2 * n if glu else n, k, generator=g) * 0.05).to(dev, dt)
    x = torch.randn(rows, k, generator=g).to(dev, dt)
    return x, w


@pytest.mark.parametrize("n,k,glu", SHAPES)
def test_the_weights_ahead_projection_is_dot_rows_bit_for_bit(dev, kdtype, n, k, glu):
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_dot_ahead import dot_ahead
    pdls = (False, True) if HAS_CUDA and torch.cuda.get_device_capability()[0] >= 9 else (False,)
    for rows in (1, 5, 16):
        x, w = _pair(n, k, glu, rows, dev, kdtype, seed=rows)
        for pdl in pdls:
            want = dot_rows(x, w, glu=glu, gelu=glu, pdl=pdl)
            got = dot_ahead(x, w, glu=glu, gelu=glu, pdl=pdl)
            if HAS_CUDA:
                assert torch.equal(got, want), (rows, pdl, int((got != want).sum()))
            else:
                torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)


@pytest.mark.interp
def test_the_weights_ahead_projection_runs_under_the_interpreter(dev, kdtype):
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_dot_ahead import dot_ahead
    for n, k, glu in ((48, 384, False), (40, 128, False)):    # 3 parts; a ragged last tile
        x, w = _pair(n, k, glu, 3, dev, kdtype)
        torch.testing.assert_close(dot_ahead(x, w, glu=glu, gelu=glu).float(),
                                   dot_rows(x, w, glu=glu, gelu=glu).float(), rtol=2e-3, atol=2e-3)


@needs_gpu
def test_an_engine_with_the_weights_ahead_gives_the_same_bits():
    from test_cpp_dot import engine_rows
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    eng.backend.reset_runner(Env(dot_ahead="off"))
    plain = engine_rows(eng)
    eng.backend.reset_runner(Env(dot_ahead="on"))
    step = eng.backend.runner(eng).step
    assert step.ahead
    for got, want in zip(engine_rows(eng), plain):
        assert torch.equal(got, want)
    assert step.ahead_calls > 0            # the route was taken, not only allowed
