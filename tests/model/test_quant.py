"""muser.model.quant: int8 per-row weights, Q8_0 requantization, CPU kernels, row invariance."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from muser.model import quant

SHAPES = [(64, 128), (256, 640), (2048, 640), (640, 2048)]


def _w(n, k, seed=0, outlier_cols=()):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    for c in outlier_cols:
        w[:, c] *= 20
    return w


def _x(m, k, seed=1):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3


def test_quantize_rowwise_error_bound_and_nbytes():
    w = _w(64, 128)
    ql = quant.quantize_rowwise_int8(w)
    assert ql.qweight.dtype == torch.int8 and ql.qweight.shape == (64, 128) and ql.in_scale is None
    assert int(ql.qweight.abs().max()) == 127
    err = (quant.dequantize(ql) - w).abs()
    assert bool((err <= ql.scale[:, None] / 2 + 1e-7).all())
    assert ql.nbytes() == 64 * 128 + 64 * 4
    quant.linear(_x(1, 128), ql, kernel="fbgemm")  # caches the fbgemm packing: counted
    assert ql.nbytes() == 64 * 128 + 64 * 4 + 64 * 130


def test_zero_rows_and_columns():
    w = _w(16, 64)
    w[3] = 0
    w[:, 5] = 0
    for eq in (False, True):
        ql = quant.quantize_rowwise_int8(w, equalize=eq)
        assert torch.isfinite(ql.scale).all()
        assert torch.equal(quant.dequantize(ql)[3], torch.zeros(64))
        assert torch.isfinite(quant.linear(_x(2, 64), ql)).all()


@pytest.mark.parametrize("n,k", SHAPES)
def test_weight_only_kernels_match_dequantized_linear(n, k):
    w = _w(n, k, outlier_cols=(3, 17))
    x = _x(5, k)
    for eq in (False, True):
        ql = quant.quantize_rowwise_int8(w, equalize=eq)
        ref = F.linear(x, quant.dequantize(ql))
        scale = ref.abs().max()
        # f32 activations: only accumulation order differs
        torch.testing.assert_close(quant.linear(x, ql, kernel="int8_f32"), ref, rtol=0, atol=1e-5 * scale)
        # bf16: x, the row scales and the OUTPUT are rounded to bf16 (8 mantissa bits; the
        # aten kernel returns x.dtype), the int8 x bf16 products are accumulated in f32
        xb = (x * ql.in_scale if eq else x).bfloat16().float()
        refb = F.linear(xb, ql.qweight.float() * ql.scale.bfloat16().float()[:, None])
        yb = quant.linear(x, ql, kernel="int8_bf16")
        assert bool(((yb - refb).abs() <= 2**-8 * refb.abs() + 1e-5 * scale).all())
        assert (yb - ref).abs().max() < 1e-2 * scale


@pytest.mark.parametrize("kernel", ["int_mm", "fbgemm", "int_mm2", "fbgemm2"])
def test_activation_quant_kernels_close(kernel):
    w = _w(256, 640, outlier_cols=(5,))
    x = _x(4, 640)
    x[:, 9] *= 20  # an activation outlier
    ql = quant.quantize_rowwise_int8(w)
    ref = F.linear(x, quant.dequantize(ql))
    err = (quant.linear(x, ql, kernel=kernel) - ref).abs().max() / ref.abs().max()
    assert err < (0.05 if kernel in ("int_mm", "fbgemm") else 5e-4)  # 8-bit vs ~14-bit activations


def test_exact_backends_available_and_bitwise_equal():
    ok = quant.exact_backends()
    assert ok, "neither fbgemm nor torch._int_mm does exact int8 GEMMs here"
    if set(ok) != {"fbgemm", "int_mm"}:
        pytest.skip(f"only {ok} exact on this CPU")
    for n, k in SHAPES:
        ql = quant.quantize_rowwise_int8(_w(n, k), equalize=True)
        for m in (1, 3, 16):
            x = _x(m, k)
            assert torch.equal(quant.linear(x, ql, kernel="fbgemm"), quant.linear(x, ql, kernel="int_mm"))
            assert torch.equal(quant.linear(x, ql, kernel="fbgemm2"), quant.linear(x, ql, kernel="int_mm2"))


def test_auto_kernel_per_weight(monkeypatch):
    small = quant.quantize_rowwise_int8(_w(256, 640))
    assert quant.auto_kernel(small) == "int8_bf16"
    monkeypatch.setattr(quant, "AUTO_LARGE", 256 * 640)
    assert quant.auto_kernel(small) in ("fbgemm2", "int_mm2")
    x = _x(24, 640)
    full = quant.linear(x, small)
    assert torch.equal(full, quant.linear(x, small, kernel=quant.auto_kernel(small)))
    for m in (1, 2, 5, 16):
        assert torch.equal(quant.linear(x[:m], small), full[:m])


def test_int_mm_is_exact_integer_math():
    w = _w(64, 128)
    ql = quant.quantize_rowwise_int8(w)
    x = torch.randint(-127, 128, (3, 128)).float()
    x[:, 0] = 127  # per-row activation scale 1.0: activation quantization is exact
    ref = (x.double() @ ql.qweight.double().t()) * ql.scale.double()
    for kernel in ("int_mm", "fbgemm", "int_mm2", "fbgemm2"):
        torch.testing.assert_close(quant.linear(x, ql, kernel=kernel).double(), ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("kernel", quant.KERNELS + ("auto",))
def test_row_invariance(kernel, n, k):
    """Row i of an M-row call is bitwise the M=1 call (needed for bitwise speculative rollback).

    The exact-integer kernels are invariant by construction; int8_bf16 / int8_f32 (aten
    _weight_int8pack_mm) are measured to be on torch 2.13 CPU - this test guards that.
    """
    ql = quant.quantize_rowwise_int8(_w(n, k), equalize=True)
    x = _x(24, k)
    full = quant.linear(x, ql, kernel=kernel)
    for m in (2, 3, 4, 5, 16):
        assert torch.equal(quant.linear(x[:m], ql, kernel=kernel), full[:m])
    for i in (0, 7, 23):
        assert torch.equal(quant.linear(x[i:i + 1], ql, kernel=kernel), full[i:i + 1])


def test_leading_dims_and_dtype():
    ql = quant.quantize_rowwise_int8(_w(64, 128))
    x = _x(6, 128).view(2, 3, 128)
    for dt in (torch.float32, torch.bfloat16):
        y = quant.linear(x.to(dt), ql)
        assert y.shape == (2, 3, 64) and y.dtype == dt
    assert torch.equal(quant.linear(x, ql), quant.linear(x.reshape(6, 128), ql).view(2, 3, 64))


def _q8_0(n, k, seed=2):
    g = torch.Generator().manual_seed(seed)
    qs = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-4).half().float()
    return qs, d, (qs.view(n, -1, 32).float() * d[..., None]).view(n, k)


def test_from_q8_0_single_scale_per_row_is_exact():
    qs, d, _ = _q8_0(32, 128)
    d[:] = d[:, :1]
    ql = quant.from_q8_0_blocks(qs, d, equalize=False)
    assert torch.equal(ql.qweight, qs) and torch.equal(ql.scale, d[:, 0])


@pytest.mark.parametrize("equalize", [False, True])
def test_from_q8_0_blocks_error(equalize):
    qs, d, w = _q8_0(40000, 64)  # > one 16384-row chunk
    ql = quant.from_q8_0_blocks(qs, d, equalize=equalize)
    deq = quant.dequantize(ql)
    # per element at most half a step of the row's (pre-scaled) grid
    step = ql.scale[:, None] * (ql.in_scale[None, :] if equalize else 1)
    assert bool(((deq - w).abs() <= step / 2 * (1 + 1e-3)).all())  # + float rounding
    assert (deq - w).norm() / w.norm() < 0.02
    x = _x(3, 64)
    ref = F.linear(x, w)
    assert (quant.linear(x, ql, kernel="int8_f32") - ref).abs().max() < 0.02 * ref.abs().max()


def test_from_q8_0_equalization_helps_outlier_columns():
    qs, d, _ = _q8_0(512, 128)
    d[:, 1] *= 30  # one block of columns (32..63) is 30x larger in every row
    w = (qs.view(512, -1, 32).float() * d[..., None]).view(512, 128)
    errs = {eq: ((quant.dequantize(quant.from_q8_0_blocks(qs, d, equalize=eq)) - w).norm() / w.norm()).item()
            for eq in (False, True)}
    assert errs[True] < errs[False]


def test_bad_inputs():
    with pytest.raises(ValueError):
        quant.quantize_rowwise_int8(torch.zeros(4, 4, dtype=torch.int8))
    with pytest.raises(ValueError):
        quant.from_q8_0_blocks(torch.zeros(4, 48, dtype=torch.int8), torch.ones(4, 1))
    with pytest.raises(ValueError):
        quant.from_q8_0_blocks(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 3))
    ql = quant.quantize_rowwise_int8(_w(8, 32))
    with pytest.raises(ValueError):
        quant.linear(torch.zeros(1, 31), ql)
    with pytest.raises(ValueError):
        quant.linear(torch.zeros(1, 32), ql, kernel="nope")
