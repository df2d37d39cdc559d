"""MUSER_DOT_CPP (backends/cuda/cpp_dot.py, csrc/gemv_mma.cu): the CUDA C++ projections give
dot_rows' decode-tile bits -- each ending (rounded, gelu(gate) * up, split-K pieces) at 1, 5 and
16 rows, bf16 weights and int8 rows (quant="int8") -- and an engine with them decodes, prefills
and batches bit for bit as without; with the add+norm made inside the projection
(MUSER_DOT_CPP=norm), h' and the projection are add_norm's then dot_rows' bits.  Needs an sm_90
GPU and nvcc (the kernel is built on first use); skipped elsewhere."""
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
@pytest.mark.parametrize("quant,variant", [("bf16", "on"), ("bf16", "11"), ("bf16", "41"),
                                           ("bf16", "12"), ("int8", "on"), ("int8", "41")])
@pytest.mark.parametrize("n,k,glu,piece", SHAPES)
def test_the_cpp_projection_is_dot_rows_bit_for_bit(cpp, n, k, glu, piece, quant, variant):
    """bf16 weights, and int8 rows (quant="int8": copied as int8, each k pair converted to bf16
    in the B fragment, the row scale on the finished sum, the unfused GELU epilogue; split
    pieces unscaled, as dot_rows' deferred int8 pieces are)."""
    from muser.backends.cuda.cpp_dot import CppDot
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.weights_int8 import quantize_rows
    kern = CppDot(cpp.lib, variant)
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(2 * n if glu else n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    w = quantize_rows(w) if quant == "int8" else w
    q, scale = (w.q, w.scale) if quant == "int8" else (w, None)
    for rows in (1, 5, 16):
        x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
        plan = kern.plan(x, w, n, glu, glu, piece, defer=True)
        assert plan is not None, (n, k, glu, rows, variant)
        for pdl in (False, True):
            got = kern(x, w, n, plan, pdl)
            want = (dot_rows(x, q, scale=scale, rows=16, defer=True).part if piece
                    else dot_rows(x, q, scale=scale, glu=glu, gelu=glu, rows=16))
            torch.cuda.synchronize()
            assert torch.equal(got, want), (rows, pdl, int((got != want).sum()))


def engine_rows(eng):
    """An engine's logits through prefill / decode / extend, and a 3-session decode batch."""
    one = run(eng, extend=[9, 8, 7])
    ss = [eng.new_session() for _ in range(3)]
    for i, s in enumerate(ss):
        s.prefill([7 + i, 3, 99, 41, 5][: 3 + i])
    return one, eng.decode_batch(ss, [5, 17, 250])


def same_bits_with(eng, variant: str):
    """The engine's rows under MUSER_DOT_CPP=variant == without it; the step, for its checks."""
    eng.backend.reset_runner(Env(dot_cpp="off"))
    plain = engine_rows(eng)
    eng.backend.reset_runner(Env(dot_cpp=variant))
    step = eng.backend.runner(eng).step
    assert step.cpp is not None
    for got, want in zip(engine_rows(eng), plain):
        assert torch.equal(got, want)
    assert step.cpp.calls > 0            # the route was taken, not only built
    return step


@needs_sm90_nvcc
def test_an_engine_with_the_cpp_projections_gives_the_same_bits():
    same_bits_with(tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4,
                              tokenizer=False), "on")

# (n, k, glu, pieces): the add+norm before a qkv or gate|up -- the 270M's (k 640), the 1B's
# (1,152; its qkv after the down projection's 7 deferred pieces) and the 4B's (2,560: 8 warps)
NORM_SHAPES = [(1024, 640, False, 0), (2048, 640, True, 0), (1536, 1152, False, 7),
               (6912, 1152, True, 0), (4096, 2560, False, 0), (10240, 2560, True, 0)]


@needs_sm90_nvcc
@pytest.mark.parametrize("variant", ["norm", "11", "41"])
@pytest.mark.parametrize("n,k,glu,pieces", NORM_SHAPES)
def test_the_norm_in_projection_is_add_norm_then_dot_rows_bit_for_bit(cpp, n, k, glu, pieces,
                                                                      variant):
    from muser.backends.cuda.cpp_dot import CppDot
    from muser.backends.cuda.cpp_route import norm_route
    from muser.backends.cuda.triton_dot import Pieces, dot_rows
    from muser.backends.cuda.triton_ops import add_norm
    kern = CppDot(cpp.lib, variant)
    g = torch.Generator(device="cuda").manual_seed(n + k + pieces)
    w = (torch.randn(2 * n if glu else n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    w_post, w_next = (1 + torch.rand(2, k, device="cuda", generator=g)).unbind(0)
    for rows in (1, 5, 16):
        h = (8 * torch.randn(rows, k, device="cuda", generator=g)).bfloat16()
        d1 = (Pieces(torch.randn(pieces, rows, k, device="cuda", generator=g), None) if pieces
              else torch.randn(rows, k, device="cuda", generator=g).bfloat16())
        plan = kern.norm_plan(h, d1, w_post, w_next, w, n, glu, glu, 0, False)
        assert plan == norm_route(n, k, rows, glu, glu, 0, pieces, variant, False)
        if plan is None:                  # shared memory: add_norm + the projection instead
            assert rows > 1 or variant != "norm"
            continue
        h_want, x = add_norm(h, w_next, 1e-6, False, d1=d1, w_post=w_post)
        want = dot_rows(x, w, glu=glu, gelu=glu, rows=16)
        for pdl in (False, True):
            x_got = torch.full_like(x, float("nan"))
            h_got, got = kern.norm(h, d1, w_post, w_next, 1e-6, w, n, plan, pdl, x_out=x_got)
            torch.cuda.synchronize()
            # in the order they are made: h' (the first tree), x (the second), the projection
            for what, a, b in (("h'", h_got, h_want), ("x", x_got, x), ("y", got, want)):
                assert torch.equal(a, b), (what, rows, pdl, int((a != b).sum()))


@needs_sm90_nvcc
def test_an_int8_engine_with_the_cpp_projections_gives_the_same_bits():
    same_bits_with(tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4,
                              tokenizer=False, quant="int8"), "norm")


@needs_sm90_nvcc
def test_an_engine_that_norms_inside_the_projections_gives_the_same_bits():
    # hidden 1,024: add_norm's BLOCK gives each thread 8 keys (cpp_route.norm_route)
    eng = tiny_model("gemma3", device="cuda", dtype="bfloat16", window=4, tokenizer=False,
                     layers=3, hidden=1024, heads=4, kv_heads=2, head_dim=64)
    step = same_bits_with(eng, "norm")
    assert step.norm_later and step.cpp.norm_calls > 0
