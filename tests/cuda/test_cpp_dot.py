"""MUSER_DOT_CPP (backends/cuda/cpp_dot.py, csrc/gemv_mma.cu): the CUDA C++ projections give
dot_rows' decode-tile bits -- each ending (rounded, gelu(gate) * up, split-K pieces) at 1, 5 and
16 rows -- and an engine with them decodes, prefills and batches bit for bit as without.
Needs an sm_90 GPU and nvcc (the kernel is built on first use); skipped elsewhere."""
import shutil

import pytest
import torch
from cudautil import HAS_CUDA, prefill_then_decode as run

from muser.env import Env
from muser.testing import tiny_model

needs_sm90_nvcc = pytest.mark.skipif(
    not (HAS_CUDA and torch.cuda.get_device_capability()[0] == 9 and shutil.which("nvcc")),
    reason="needs an sm_90 GPU and nvcc")


@pytest.fixture(scope="module")
def cpp(tmp_path_factory):
    from muser.backends.cuda.cpp_dot import load
    k = load("on", tmp_path_factory.mktemp("native"), torch.device("cuda"))
    assert k is not None
    return k


# (n, k, glu, piece): the 1B's qkv, o, gate|up and down (1,024-key pieces, deferred)
SHAPES = [(1536, 1152, False, 0), (1152, 1024, False, 0), (6912, 1152, True, 0),
          (1152, 6912, False, 1024)]


@needs_sm90_nvcc
@pytest.mark.parametrize("variant", ["on", "11", "41", "12"])
@pytest.mark.parametrize("n,k,glu,piece", SHAPES)
def test_the_cpp_projection_is_dot_rows_bit_for_bit(cpp, n, k, glu, piece, variant):
    from muser.backends.cuda.cpp_dot import CppDot
    from muser.backends.cuda.triton_dot import dot_rows
    kern = CppDot(cpp.lib, variant)
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(2 * n if glu else n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    for rows in (1, 5, 16):
        x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
        plan = kern.plan(x, w, n, glu, glu, piece, defer=True)
        assert plan is not None, (n, k, glu, rows, variant)
        for pdl in (False, True):
            got = kern(x, w, n, plan, pdl)
            want = (dot_rows(x, w, rows=16, defer=True).part if piece
                    else dot_rows(x, w, glu=glu, gelu=glu, rows=16))
            torch.cuda.synchronize()
            assert torch.equal(got, want), (rows, pdl, int((got != want).sum()))


@needs_sm90_nvcc
def test_an_engine_with_the_cpp_projections_gives_the_same_bits():
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    eng.backend.reset_runner(Env(dot_cpp="off"))
    plain = run(eng, extend=[9, 8, 7])
    ss = [eng.new_session() for _ in range(3)]
    for i, s in enumerate(ss):
        s.prefill([7 + i, 3, 99, 41, 5][: 3 + i])
    plain_b = eng.decode_batch(ss, [5, 17, 250])
    eng.backend.reset_runner(Env(dot_cpp="on"))
    step = eng.backend.runner(eng).step
    assert step.cpp is not None
    assert torch.equal(run(eng, extend=[9, 8, 7]), plain)
    ss = [eng.new_session() for _ in range(3)]
    for i, s in enumerate(ss):
        s.prefill([7 + i, 3, 99, 41, 5][: 3 + i])
    assert torch.equal(eng.decode_batch(ss, [5, 17, 250]), plain_b)
    assert step.cpp.calls > 0            # the route was taken, not only built
