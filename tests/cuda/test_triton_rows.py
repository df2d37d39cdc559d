"""Chunk row kernels (muser.backends.cuda.triton_rows) against muser.model.ops' eager maths
(ops.*, device-free), outputs poisoned first; determinism and row invariance (a row's result
does not depend on the chunk's row count); the engine's chunk path fused vs eager."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from muser.model import ops

from cudautil import needs_gpu, needs_kernels, rel

pytestmark = [needs_kernels, pytest.mark.interp]     # the whole file: ~10 s interpreted


def spec(layernorm=False, interleaved=False):
    return SimpleNamespace(norm="layernorm" if layernorm else "rms", norm_eps=1e-6,
                           rope_interleaved=interleaved, activation="gelu_tanh")


def poison(shape, dtype, dev):
    """A NaN block of this size, freed at once: the caching allocator hands it to the next
    same-size allocation (the kernel's output), so an unwritten element shows as NaN."""
    torch.full(shape, float("nan"), dtype=dtype, device=dev)


def same_rows(fn, x, *args):
    """fn over all rows == fn over the first rows, bit for bit; and twice == once."""
    full = fn(x, *args)
    assert torch.equal(full, fn(x, *args))
    assert torch.equal(full[:5], fn(x[:5], *args))
    return full


@pytest.mark.parametrize("layernorm", [False, True])
@pytest.mark.parametrize("n", [64, 1152, 2560])
def test_norm(dev, kdtype, layernorm, n):
    from muser.backends.cuda import triton_rows
    x = torch.randn(37, n).to(dev, kdtype) * 3
    w = torch.randn(n, device=dev)
    poison((37, n), kdtype, dev)
    out = same_rows(lambda a, b: triton_rows.norm(a, b, 1e-6, layernorm), x, w)
    assert not out.isnan().any() and out.dtype == kdtype
    assert rel(out, ops.norm(x, w, spec(layernorm))) < 1e-2


@pytest.mark.parametrize("layernorm", [False, True])
@pytest.mark.parametrize("mode", ["plain", "sandwich", "sandwich_last", "parallel"])
def test_residual(dev, kdtype, layernorm, mode):
    from muser.backends.cuda import triton_rows
    T, N = 45, 1152
    h, d, d2 = (torch.randn(T, N).to(dev, kdtype) for _ in range(3))
    wp, wn = torch.randn(N, device=dev), torch.randn(N, device=dev)
    sp = spec(layernorm)
    w_post = wp if mode.startswith("sandwich") else None
    w_next = None if mode in ("sandwich_last", "parallel") else wn
    d2 = d2 if mode == "parallel" else None
    poison((T, N), kdtype, dev)
    ho, xo = triton_rows.residual(h, d, 1e-6, layernorm, w_post, w_next, d2)
    rh = h + (ops.norm(d, w_post, sp) if w_post is not None else d)
    if d2 is not None:
        rh = rh + d2
    assert not ho.isnan().any() and rel(ho, rh) < 1e-2
    assert (xo is None) == (w_next is None)
    if w_next is not None:
        assert not xo.isnan().any() and rel(xo, ops.norm(rh, wn, sp)) < 1e-2
    again = triton_rows.residual(h[:5], d[:5], 1e-6, layernorm, w_post, w_next,
                                 None if d2 is None else d2[:5])
    assert torch.equal(again[0], ho[:5]) and (xo is None or torch.equal(again[1], xo[:5]))
    assert torch.equal(h, h.clone())                            # inputs untouched (new outputs)


MODES = [("rms", True, False), ("rms", True, True), ("rms", False, False), ("layernorm", True, False),
         (None, True, False), (None, True, True)]


@pytest.mark.parametrize("norm,rope,interleaved", MODES)
@pytest.mark.parametrize("H,KV,D", [(8, 3, 64), (8, 4, 256), (4, 1, 256)])
def test_norm_rope(dev, kdtype, norm, rope, interleaved, H, KV, D):
    from muser.backends.cuda import triton_rows
    if D == 256 and (norm, rope, interleaved) != ("rms", True, False):
        pytest.skip("the real Gemma shapes in Gemma's mode only")
    T = 40
    qkv = torch.randn(T, (H + 2 * KV) * D).to(dev, kdtype) * 2      # q, k: strided token rows
    q, k = qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + KV) * D].view(T, KV, D)
    sp = spec(norm == "layernorm", interleaved)
    pos = torch.randint(0, 5000, (T,), device=dev)
    cos, sin = ops.rope_tables(10000.0, 1.0, D, dev, 5000)
    cos, sin = (cos[pos], sin[pos]) if rope else (None, None)
    for x in (q, k):
        w = torch.randn(D, device=dev) if norm else None
        poison(x.shape, kdtype, dev)
        out = triton_rows.norm_rope(x, w, 1e-6, norm == "layernorm", cos, sin, interleaved)
        assert out.is_contiguous() and out.shape == x.shape and not out.isnan().any()
        assert rel(out, ops.norm_rope(x, w, sp, cos, sin)) < 1e-2
        assert torch.equal(out, triton_rows.norm_rope(x, w, 1e-6, norm == "layernorm", cos, sin,
                                                      interleaved))
        part = triton_rows.norm_rope(x[:5], w, 1e-6, norm == "layernorm",
                                     None if cos is None else cos[:5], None if sin is None else sin[:5],
                                     interleaved)
        assert torch.equal(part, out[:5])


@pytest.mark.parametrize("gelu", [True, False])
@pytest.mark.parametrize("halves", [False, True])
def test_act_mul(dev, kdtype, gelu, halves):
    from muser.backends.cuda import triton_rows
    T, I = 37, 1500
    if halves:                                                     # chunk(2) of a fused gate|up
        g, u = torch.randn(T, 2 * I).to(dev, kdtype).chunk(2, dim=-1)
    else:
        g, u = torch.randn(T, I).to(dev, kdtype), torch.randn(T, I).to(dev, kdtype)
    ref = (F.gelu(g, approximate="tanh") if gelu else F.silu(g)) * u
    poison((T, I), kdtype, dev)
    out = same_rows(lambda a, b: triton_rows.act_mul(a, b, gelu), g, u)
    assert not out.isnan().any() and rel(out, ref) < 1e-2


@needs_gpu
@pytest.mark.parametrize("arch", ["gemma3", "cohere2"])
def test_chunk_path_fused_agrees_with_eager(monkeypatch, arch):
    """Prefill + extend logits through the row kernels vs the eager maths, same model (the
    ops table is chosen when the engine is built: one engine per MUSER_ROWS mode)."""
    from muser.testing import tiny_model
    g = torch.Generator().manual_seed(3)
    prompt, more = (torch.randint(3, 384, (n,), generator=g).tolist() for n in (29, 7))
    out = {}
    for mode in ("eager", "fused"):
        monkeypatch.setenv("MUSER_ROWS", mode)
        engine = tiny_model(arch, device="cuda", dtype="bfloat16", window=4, tokenizer=False)
        assert (engine.backend.ops.norm is ops.norm) == (mode == "eager")
        s = engine.new_session()
        out[mode] = (s.prefill(prompt, chunk_size=8), s.extend(more))
    for a, b in zip(out["fused"], out["eager"]):
        assert rel(a, b) < 2e-2
