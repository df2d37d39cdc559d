"""The native CPU kernels (muser/model/native.py) against plain-torch references: the maths,
the exactness contract (row- and thread-invariance), the dtypes, and typed refusals."""
import pytest
import torch

from muser.model import native, native_build
from muser.model import ops
from muser.model.quant import quantize_rowwise_int8

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: native kernels not built")


def _ref_q8(x, q, in_scale=None):
    xs = x.double() * (1 if in_scale is None else in_scale.double())
    return xs @ q.qweight.double().T * q.scale.double()


@pytest.mark.parametrize("n,k,m,equalize", [
    (1536, 640, 1, False), (640, 2048, 3, False), (37, 640, 5, True),   # N not a multiple of 4
    (64, 40, 2, False),                                                 # K % 16 != 0: portable path
    (64, 48, 5, True),                                                  # K % 32 != 0: the f32 FMA form
    (256, 1024, 16, True),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q8_linear_matches_float64_reference(n, k, m, equalize, dtype):
    torch.manual_seed(n + k + m)
    q = quantize_rowwise_int8(torch.randn(n, k), equalize=equalize)
    x = torch.randn(m, k).to(dtype)
    ref = _ref_q8(x, q, q.in_scale)
    y = native.q8_linear(x, q.qweight, q.scale, q.in_scale, torch.float32)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5
    yb = native.q8_linear(x, q.qweight, q.scale, q.in_scale, torch.bfloat16)
    assert torch.equal(yb, y.to(torch.bfloat16))         # the bf16 output is the f32 one rounded (RNE)


@pytest.mark.parametrize("k", [640, 40])
def test_q8_linear_rows_do_not_depend_on_the_row_count(k):
    torch.manual_seed(1)
    q = quantize_rowwise_int8(torch.randn(300, k))
    x = torch.randn(17, k).bfloat16()
    full = native.q8_linear(x, q.qweight, q.scale)
    for r in range(17):
        assert torch.equal(full[r:r + 1], native.q8_linear(x[r:r + 1], q.qweight, q.scale))
    assert torch.equal(full[3:9], native.q8_linear(x[3:9], q.qweight, q.scale))


def test_q8_linear_does_not_depend_on_the_thread_count():
    torch.manual_seed(2)
    q = quantize_rowwise_int8(torch.randn(1000, 640), equalize=True)
    x = torch.randn(5, 640)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.q8_linear(x, q.qweight, q.scale, q.in_scale)
        torch.set_num_threads(max(2, threads))
        many = native.q8_linear(x, q.qweight, q.scale, q.in_scale)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_q8_linear_refuses_wrong_operands_with_what_it_expected():
    q = quantize_rowwise_int8(torch.randn(8, 32))
    with pytest.raises(ValueError, match=r"\[M, 32\], got torch.float32 \(1, 16\)"):
        native.q8_linear(torch.randn(1, 16), q.qweight, q.scale)
    with pytest.raises(ValueError, match="float32/bfloat16 CPU tensor"):
        native.q8_linear(torch.randn(1, 32).half(), q.qweight, q.scale)
    with pytest.raises(ValueError, match=r"scale must be contiguous float32 \[8\]"):
        native.q8_linear(torch.randn(1, 32), q.qweight, q.scale[:4])


def _ref_norm_rope(x, w, eps, cos, sin, interleaved):
    v = x.double()
    if w is not None:
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    if cos is not None:
        c, s = cos.double()[:, None, :], sin.double()[:, None, :]
        if interleaved:
            a, b = v[..., 0::2], v[..., 1::2]
            v = torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2)
        else:
            h = v.shape[-1] // 2
            a, b = v[..., :h], v[..., h:]
            v = torch.cat((a * c - b * s, b * c + a * s), -1)
    return v


@pytest.mark.parametrize("norm,rope,interleaved", [
    (True, False, False), (True, True, False), (False, True, False), (True, True, True), (False, True, True),
])
@pytest.mark.parametrize("t", [1, 7, 40])
def test_norm_rope_matches_float64_reference(norm, rope, interleaved, t):
    torch.manual_seed(t)
    n, d = 3, 32
    x = torch.randn(t, n, d) * 3
    w = torch.rand(d) + 0.5 if norm else None
    ang = torch.rand(t, d // 2) * 6
    cos, sin = (ang.cos(), ang.sin()) if rope else (None, None)
    y = native.norm_rope(x, w, 1e-6, cos, sin, interleaved)
    ref = _ref_norm_rope(x, w, 1e-6, cos, sin, interleaved)
    assert y.shape == x.shape and y.is_contiguous()
    assert float((y.double() - ref).abs().max()) < 1e-5


def test_norm_rope_reads_strided_rows_and_is_row_invariant():
    """q and k are column slices of the fused q|k|v output: strided rows, contiguous heads."""
    torch.manual_seed(3)
    qkv = torch.randn(9, 6 * 16).bfloat16()
    k = qkv[:, 4 * 16:5 * 16].view(9, 1, 16)
    w = torch.rand(16) + 0.5
    ang = torch.rand(9, 8)
    y = native.norm_rope(k, w, 1e-6, ang.cos(), ang.sin())
    assert torch.equal(y, native.norm_rope(k.contiguous(), w, 1e-6, ang.cos(), ang.sin()))
    for r in range(9):
        assert torch.equal(y[r:r + 1], native.norm_rope(k[r:r + 1], w, 1e-6, ang.cos()[r:r + 1],
                                                        ang.sin()[r:r + 1]))


def test_norm_rope_refuses_tables_of_the_wrong_shape():
    x = torch.randn(2, 1, 8)
    with pytest.raises(ValueError, match=r"w must be contiguous float32 \[8\]"):
        native.norm_rope(x, torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match=r"cos must be contiguous float32 \[2, 4\]"):
        native.norm_rope(x, None, 1e-6, torch.ones(3, 4), torch.ones(3, 4))


def test_the_cpu_backend_norm_uses_the_kernel_and_agrees_with_the_eager_maths():
    """The CPU backend's ops table (native) vs the eager table of model.ops."""
    from muser.backends.cpu.ops import cpu_ops
    from muser.testing import tiny_model
    engine = tiny_model()
    spec = engine.spec
    assert engine.backend.ops is cpu_ops(native.available()) and cpu_ops(True) is not ops.EAGER
    x = torch.randn(5, spec.hidden_size)
    w = torch.rand(spec.hidden_size) + 0.5
    fast = engine.backend.ops.norm(x, w, spec)
    slow = ops.norm(x, w, spec)
    assert float((fast - slow).abs().max()) < 1e-5


def _eager_visible(q, k, v, scale, softcap):
    from muser.attention.reference import attention
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool)
    return attention(q.double(), k.double(), v.double(), mask, scale, softcap)


@pytest.mark.parametrize("layout", ["token_major", "head_major"])
@pytest.mark.parametrize("t,h,kv,s,softcap", [(1, 4, 1, 512, None), (1, 8, 4, 37, 50.0), (3, 4, 2, 1, None), (2, 16, 1, 700, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attend_visible_matches_the_reference_for_both_plane_layouts(layout, t, h, kv, s, softcap, dtype):
    torch.manual_seed(s + h)
    d = 32
    if layout == "token_major":                               # a ring: [capacity, KV, D]
        k, v = torch.randn(s, kv, d).to(dtype), torch.randn(s, kv, d).to(dtype)
    else:                                                      # a growing plane [KV, allocated, D], a span of it
        k = torch.randn(kv, s + 5, d).to(dtype)[:, :s].transpose(0, 1)
        v = torch.randn(kv, s + 5, d).to(dtype)[:, :s].transpose(0, 1)
    q = torch.randn(t, h, d).to(dtype)
    out = native.attend_visible(q, k, v, 0.125, softcap)
    ref = _eager_visible(q, k, v, 0.125, softcap)
    assert out.dtype == dtype and out.shape == (t, h, d)
    assert float((out.double() - ref).abs().max()) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_attend_visible_rows_and_threads_do_not_change_the_bits():
    torch.manual_seed(4)
    q, k, v = torch.randn(5, 4, 64), torch.randn(300, 2, 64), torch.randn(300, 2, 64)
    full = native.attend_visible(q, k, v, 0.1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(full, native.attend_visible(q, k, v, 0.1))
    finally:
        torch.set_num_threads(threads)
    for r in range(5):
        assert torch.equal(full[r:r + 1], native.attend_visible(q[r:r + 1], k, v, 0.1))


def test_attend_visible_refuses_operands_it_cannot_read_in_place():
    q, k = torch.randn(1, 2, 24), torch.randn(8, 1, 24)       # head dim not a multiple of 16
    with pytest.raises(ValueError, match="unsupported operands"):
        native.attend_visible(q, k, k, 0.1)


@pytest.fixture(scope="module", params=[("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2", "-mno-fma")],
                ids=["no-avx512", "scalar"])
def portable(request):
    """The kernels built without AVX-512 (the AVX2 paths, on an x86 that has AVX2) and without any
    vector extension (the scalar paths): what other CPUs run."""
    path = native_build.build(request.param)
    if path is None:
        pytest.skip(f"the compiler refused {' '.join(request.param)}")
    return native_build.load(path)


def test_the_portable_build_computes_the_same_maths(portable):
    torch.manual_seed(5)
    q = quantize_rowwise_int8(torch.randn(50, 64), equalize=True)
    x = torch.randn(3, 64).bfloat16()
    a = native.q8_linear(x, q.qweight, q.scale, q.in_scale, torch.float32, lib=portable)
    assert float((a.double() - _ref_q8(x, q, q.in_scale)).abs().max()) < 1e-4
    qq, k, v = torch.randn(2, 4, 32), torch.randn(300, 2, 32), torch.randn(300, 2, 32)
    out = native.attend_visible(qq, k, v, 0.2, 30.0, lib=portable)
    assert float((out.double() - _eager_visible(qq, k, v, 0.2, 30.0)).abs().max()) < 1e-5
    xs, w, ang = torch.randn(4, 2, 32), torch.rand(32) + 0.5, torch.rand(4, 16)
    y = native.norm_rope(xs, w, 1e-6, ang.cos(), ang.sin(), lib=portable)
    assert float((y.double() - _ref_norm_rope(xs, w, 1e-6, ang.cos(), ang.sin(), False)).abs().max()) < 1e-5


def test_a_failed_build_warns_and_reports_no_library(monkeypatch, tmp_path):
    monkeypatch.setenv("MUSER_CACHE_DIR", str(tmp_path))
    with pytest.warns(RuntimeWarning, match="did not build"):
        assert native_build.build(("-fno-such-flag-for-muser",)) is None


def test_an_unwritable_cache_directory_warns_instead_of_failing(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MUSER_CACHE_DIR", str(blocker))
    with pytest.warns(RuntimeWarning, match="did not build"):
        assert native_build.build(("-DMUSER_UNWRITABLE_TEST",)) is None


def test_the_fast_path_runs_without_the_native_kernels_and_agrees():
    """MUSER_NATIVE=0 (or no compiler): the int8 path falls back to aten and eager ops."""
    import os
    import subprocess
    import sys
    code = ("import torch; from muser.model import native; from muser.testing import tiny_model\n"
            "e = tiny_model(dtype='bfloat16', quant='int8', seed=3)\n"
            "s = e.new_session(); s.prefill(list(range(3, 40)))\n"
            "torch.save(torch.stack([s.decode(t) for t in (5, 6, 7)]), __import__('sys').argv[1])\n"
            "print(native.available())")
    outs = {}
    for flag in ("0", "1"):
        path = f"/tmp/muser-native-{os.getpid()}-{flag}.pt"
        r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, MUSER_NATIVE=flag))
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() == ("True" if flag == "1" else "False")
        outs[flag] = torch.load(path)
        os.unlink(path)
    a, b = outs["0"], outs["1"]
    assert torch.isfinite(a).all()
    assert float((a - b).abs().max() / (b.max() - b.min())) < 0.05


# ----------------------------------------------------------------------------- a8w8 (every projection)
@pytest.mark.parametrize("n,k,m", [
    (1536, 640, 1), (640, 2048, 3), (37, 640, 5),      # N not a multiple of the 64-row panel
    (64, 42, 7),                                       # K not a multiple of 4: zero padded
    (300, 96, 130),                                    # more rows than a tile, odd tile tail
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a8w8_is_bitwise_its_torch_reference_and_close_to_float64(n, k, m, dtype):
    torch.manual_seed(n + k + m)
    q = quantize_rowwise_int8(torch.randn(n, k))
    x = (torch.randn(m, k) * 3).to(dtype)
    x[0, k // 2] = 60.0                                # an outlier column in one row
    if m > 1:
        x[-1] = 0.0                                    # an all-zero row -> zeros
    lin = native.BoundA8W8(q.qweight, q.scale)
    for out in (torch.float32, torch.bfloat16):
        y = lin(x, out)
        assert y.dtype == out and y.shape == (m, n)
        assert torch.equal(y, native.a8w8_reference(x, q.qweight, q.scale, out))
    y = lin(x, torch.float32)
    if m > 1:
        assert torch.equal(y[-1], torch.zeros(n))
    ref = _ref_q8(x, q)                                # exact float64 maths of the int8 weights
    # two int8 planes: ~15-bit activations, error ~ row max / 2^15 per product
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 5e-4


def test_a8w8_rows_tiles_and_threads_do_not_change_a_bit():
    torch.manual_seed(6)
    q = quantize_rowwise_int8(torch.randn(200, 640))
    lin = native.BoundA8W8(q.qweight, q.scale)
    x = torch.randn(37, 640).bfloat16()
    full = lin(x, torch.bfloat16)
    for r in range(37):
        assert torch.equal(full[r:r + 1], lin(x[r:r + 1], torch.bfloat16))
    for a, b in ((0, 5), (3, 12), (7, 37)):
        assert torch.equal(full[a:b], lin(x[a:b], torch.bfloat16))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(full, lin(x, torch.bfloat16))
    finally:
        torch.set_num_threads(threads)


def test_a8w8_a_row_with_inf_or_nan_gives_nan_and_leaves_the_others_alone():
    torch.manual_seed(7)
    q = quantize_rowwise_int8(torch.randn(70, 64))
    lin = native.BoundA8W8(q.qweight, q.scale)
    x = torch.randn(3, 64)
    clean = lin(x, torch.float32)
    for bad in (float("inf"), float("nan")):
        xb = x.clone()
        xb[1, 5] = bad
        y = lin(xb, torch.float32)
        assert bool(y[1].isnan().all())
        assert torch.equal(y[0], clean[0]) and torch.equal(y[2], clean[2])


def test_a8w8_refuses_operands_with_what_it_expected():
    q = quantize_rowwise_int8(torch.randn(8, 32))
    with pytest.raises(ValueError, match=r"\[-127, 127\]"):
        native.BoundA8W8(torch.full((8, 32), -128, dtype=torch.int8), q.scale)
    lin = native.BoundA8W8(q.qweight, q.scale)
    with pytest.raises(ValueError, match=r"\[M, 32\], got torch.float32 \(1, 16\)"):
        lin(torch.randn(1, 16), torch.float32)
    with pytest.raises(ValueError, match="out_dtype"):
        lin(torch.randn(1, 32), torch.float16)


# ----------------------------------------------------------------------------- attend_rows
def _ref_rows(q, keys, values, positions, window, key_positions, scale, softcap=None):
    """float64 masked attention: keys/values [S, KV, D] at key_positions [S]."""
    from muser.attention.reference import attention, visibility_mask
    mask = visibility_mask(positions, key_positions, window)
    return attention(q.double(), keys.double(), values.double(), mask, scale, softcap)


@pytest.mark.parametrize("h,kv,d,softcap", [(4, 1, 256, None), (8, 2, 64, 30.0), (6, 2, 32, None), (16, 1, 32, None),
                                            (2, 2, 16, None)])
@pytest.mark.parametrize("window,start,t", [(None, 0, 9), (None, 700, 40), (64, 300, 37), (512, 1000, 21)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attend_rows_matches_the_reference_and_no_row_depends_on_the_others(h, kv, d, softcap, window, start, t,
                                                                          dtype):
    torch.manual_seed(h + d + start)
    s = start + t                                             # keys 0 .. s-1, positions ascending
    k, v = torch.randn(s, kv, d).to(dtype), torch.randn(s, kv, d).to(dtype)
    q = torch.randn(t, h, d).to(dtype)
    out = native.attend_rows(q, k, v, start, window, 0, 0.125, softcap)
    ref = _ref_rows(q, k, v, torch.arange(start, s), window, torch.arange(s), 0.125, softcap)
    assert out.dtype == dtype and out.shape == (t, h, d)
    assert float((out.double() - ref).abs().max()) < (2e-5 if dtype == torch.float32 else 2e-2)
    for r in range(t):                                        # each row alone (a decode step)
        assert torch.equal(out[r:r + 1], native.attend_rows(q[r:r + 1], k, v, start + r, window, 0, 0.125, softcap))
    parts = [native.attend_rows(q[a:a + 7], k, v, start + a, window, 0, 0.125, softcap) for a in range(0, t, 7)]
    assert torch.equal(out, torch.cat(parts))                 # any chunking


def test_attend_rows_reads_a_rotated_ring_and_a_head_major_span_like_ordered_keys():
    torch.manual_seed(8)
    d, cap, s = 64, 128, 300                                  # a ring of 128 rows holding positions 172..299
    k, v = torch.randn(s, 1, d).bfloat16(), torch.randn(s, 1, d).bfloat16()
    q = torch.randn(1, 4, d).bfloat16()
    ordered = native.attend_rows(q, k, v, s - 1, cap, 0, 0.1)
    rot = 77
    ring_k, ring_v = torch.empty(cap, 1, d, dtype=torch.bfloat16), torch.empty(cap, 1, d, dtype=torch.bfloat16)
    slots = (rot + torch.arange(cap)) % cap
    ring_k[slots], ring_v[slots] = k[s - cap:], v[s - cap:]
    assert torch.equal(ordered, native.attend_rows(q, ring_k, ring_v, s - 1, cap, s - cap, 0.1, rotation=rot))
    hk = torch.zeros(1, s + 40, d, dtype=torch.bfloat16)      # a growing plane [KV, allocated, D]
    hv = torch.zeros_like(hk)
    hk[:, :s], hv[:, :s] = k.transpose(0, 1), v.transpose(0, 1)
    span_k, span_v = hk[:, :s].transpose(0, 1), hv[:, :s].transpose(0, 1)
    assert torch.equal(ordered, native.attend_rows(q, span_k, span_v, s - 1, cap, 0, 0.1))


def test_attend_rows_threads_do_not_change_a_bit():
    torch.manual_seed(9)
    q, k, v = torch.randn(30, 4, 64), torch.randn(600, 1, 64), torch.randn(600, 1, 64)
    full = native.attend_rows(q, k, v, 570, 512, 0, 0.1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(full, native.attend_rows(q, k, v, 570, 512, 0, 0.1))
    finally:
        torch.set_num_threads(threads)


def test_attend_rows_refuses_rows_whose_keys_the_source_does_not_hold():
    q, k = torch.randn(4, 4, 32), torch.randn(100, 1, 32)
    with pytest.raises(ValueError, match="need keys the source does not hold"):
        native.attend_rows(q, k, k, 98, None, 0, 0.1)          # rows 98..101, keys 0..99
    with pytest.raises(ValueError, match="need keys the source does not hold"):
        native.attend_rows(q, k, k, 150, 100, 60, 0.1)         # row 150 sees 51.., the keys start at 60


def test_the_portable_build_gives_the_same_bits_as_the_vector_one(portable):
    """Integer sums and the fixed reduction trees are the same maths in scalar code."""
    torch.manual_seed(10)
    q = quantize_rowwise_int8(torch.randn(90, 100))
    x = torch.randn(5, 100).bfloat16()
    assert torch.equal(native.BoundA8W8(q.qweight, q.scale)(x, torch.float32),
                       native.BoundA8W8(q.qweight, q.scale, lib=portable)(x, torch.float32))
    qq, k, v = torch.randn(13, 8, 64).bfloat16(), torch.randn(700, 2, 64).bfloat16(), torch.randn(700, 2, 64).bfloat16()
    fast = native.attend_rows(qq, k, v, 650, 512, 0, 0.0625)
    slow = native.attend_rows(qq, k, v, 650, 512, 0, 0.0625, lib=portable)
    assert torch.equal(fast, slow)
    for r in range(13):
        assert torch.equal(slow[r:r + 1], native.attend_rows(qq[r:r + 1], k, v, 650 + r, 512, 0, 0.0625, lib=portable))
