"""Int8 weight quantization and the CPU linear kernels that consume it.

Owns: `QuantizedLinear` (int8 [N, K] weights, one symmetric f32 scale per output row, an optional
f32 per-input-column pre-scale), the quantizers that build it (`quantize_rowwise_int8` from float
weights, `from_q8_0_blocks` from GGUF Q8_0 blocks), `dequantize`, and `linear`, y = x @ W.T with
the kernel measured fastest on 2 Zen 4 cores (benchmarks/NOTES.md, "CPU matmul kernels (2 threads,
torch 2.13)"; reproduce with `python benchmarks/cpu_kernels.py`).
Does not own: GGUF parsing, thread / OpenMP settings, model code, sampling.

Kernels (`linear(..., kernel=)`; all return x.dtype):
  "int8_bf16"  aten._weight_int8pack_mm with bf16 activations; x, the scales and the OUTPUT are
               bf16-rounded.  Weight-only.  Row-invariant as measured (not documented).
  "int8_f32"   same with f32 activations: accurate but ~6x slower (no fast path).
  "int_mm", "fbgemm"
               activations quantized per row to int8 (x ~ s1 * x1), an exact int32 GEMM, then
               fl(fl(acc * scale) * s1).  "int_mm" runs torch._int_mm (oneDNN); "fbgemm" runs
               quantized::linear_dynamic on integer-valued floats with two pinned columns
               (-128, 127; zero weights), which forces its dynamic activation scale to exactly 1
               so its uint8 quantization is exact.  Both backends give bitwise-equal results.
  "int_mm2", "fbgemm2"
               the same with two int8 planes per row (x ~ s1*x1 + s2*x2, ~14-bit activations)
               stacked into one GEMM of 2M rows: int8_f32 accuracy, f32 output.
  "auto"       chosen per weight, never per M, so row i of an M-row call is bitwise the M=1 call
               (bitwise speculative rollback): weights of >= AUTO_LARGE elements (the 262144x640
               LM head: 6.7 ms at M=1 vs 11.8 for int8_bf16) take "fbgemm2" ("int_mm2" where fbgemm
               is not exact); smaller ones (per-layer projections, where the ~10 eager ops that
               build the activation planes cost more than the GEMM at M=1) take "int8_bf16".
The exact-integer backends are checked once per process against int64 math (`exact_backends`);
a backend that fails (e.g. a CPU without VNNI where u8*s8 pairs saturate) is not used by "auto".

The per-input-column pre-scale ("column equalization") divides each weight column by its max |w|
before the per-row quantization and multiplies x by it instead; exact in real arithmetic, it
recovers most of the accuracy that per-row scales lose on the Gemma embedding's outlier columns.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor

__all__ = ["QuantizedLinear", "quantize_rowwise_int8", "from_q8_0_blocks", "dequantize", "linear",
           "auto_kernel", "exact_backends", "KERNELS"]

KERNELS = ("int8_bf16", "int8_f32", "int_mm", "fbgemm", "int_mm2", "fbgemm2")
AUTO_LARGE = 1 << 22  # weights with at least this many elements use the exact-integer path
Q8_0_BLOCK = 32
_CHUNK = 16384  # rows per step when requantizing (bounds f32 scratch to ~40 MB at K=640)


class QuantizedLinear:
    """int8 weights [N, K] with per-row scales [N]: W ~= in_scale[None, :] * scale[:, None] * qweight.

    `in_scale` (K,) or None: x is multiplied by it before the int8 kernel (column equalization).
    Derived kernel operands (bf16 scales, the fbgemm packing) are built lazily and cached.
    """

    __slots__ = ("qweight", "scale", "in_scale", "_cache")

    def __init__(self, qweight: Tensor, scale: Tensor, in_scale: Tensor | None = None):
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError(f"qweight must be 2-D int8, got {qweight.dtype} {tuple(qweight.shape)}")
        n, k = qweight.shape
        if scale.shape != (n,):
            raise ValueError(f"scale must have shape ({n},), got {tuple(scale.shape)}")
        if in_scale is not None and in_scale.shape != (k,):
            raise ValueError(f"in_scale must have shape ({k},), got {tuple(in_scale.shape)}")
        self.qweight = qweight.contiguous()
        self.scale = scale.to(torch.float32).contiguous()
        self.in_scale = None if in_scale is None else in_scale.to(torch.float32).contiguous()
        self._cache: dict[str, object] = {}

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    def nbytes(self) -> int:
        """Bytes held: int8 weights, scales, pre-scale, and cached operands (the fbgemm packing,
        built on first fbgemm use, is a second ~N*(K+2)-byte copy of the weights)."""
        n = self.qweight.nbytes + self.scale.nbytes + (0 if self.in_scale is None else self.in_scale.nbytes)
        for key, v in self._cache.items():
            n += v.nbytes if isinstance(v, Tensor) else self.out_features * (self.in_features + 2) * (key == "fbgemm")
        return n

    def __repr__(self) -> str:
        eq = ", column-equalized" if self.in_scale is not None else ""
        return f"QuantizedLinear({self.in_features} -> {self.out_features}, int8 per-row{eq})"


def _quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def _column_scale(cmax: Tensor) -> Tensor:
    return torch.where(cmax > 0, cmax / cmax[cmax > 0].mean(), torch.ones_like(cmax))


def quantize_rowwise_int8(w: Tensor, *, equalize: bool = False) -> QuantizedLinear:
    """Symmetric per-output-row int8 quantization (values in [-127, 127]) of a float weight [N, K].

    equalize=True first divides each input column by its max |w| (kept as `in_scale`), which
    helps when a few input columns carry outliers (the Gemma embedding does).
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"expected a 2-D float weight, got {w.dtype} {tuple(w.shape)}")
    w = w.detach().to(torch.float32)
    in_scale = _column_scale(w.abs().amax(dim=0)) if equalize else None
    q, scale = _quantize_rows(w if in_scale is None else w / in_scale)
    return QuantizedLinear(q, scale, in_scale)


def from_q8_0_blocks(qs: Tensor, block_scales: Tensor, *, equalize: bool = True) -> QuantizedLinear:
    """Requantize GGUF Q8_0 (int8 [N, K]; one scale per 32 consecutive values of a row, [N, K//32])
    to the per-row layout the kernels take.

    No aten CPU kernel takes per-block int8 scales (`_weight_int8pack_mm` wants [N]; emulating the
    blocks with 20 GEMMs of K=32 is ~20x slower), so the exact values d * q are requantized.  With
    equalize=True the logit error on the Gemma 3 LM head is about that of llama.cpp's own
    Q8_0 x Q8_0 dot products (notes); without it, ~4x larger.
    """
    if qs.dtype != torch.int8 or qs.dim() != 2 or qs.shape[1] % Q8_0_BLOCK:
        raise ValueError(f"qs must be int8 [N, K] with K % 32 == 0, got {qs.dtype} {tuple(qs.shape)}")
    n, k = qs.shape
    if block_scales.shape != (n, k // Q8_0_BLOCK):
        raise ValueError(f"block_scales must be [{n}, {k // Q8_0_BLOCK}], got {tuple(block_scales.shape)}")
    d = block_scales.to(torch.float32)
    if not equalize and bool((d == d[:, :1]).all()) and bool((d[:, 0] > 0).all()):
        return QuantizedLinear(qs, d[:, 0].clone())  # already one scale per row: exact

    def rows(a):  # dequantized rows [a, a + _CHUNK)
        return (qs[a:a + _CHUNK].view(-1, k // Q8_0_BLOCK, Q8_0_BLOCK) * d[a:a + _CHUNK, :, None]).view(-1, k)

    in_scale = None
    if equalize:
        cmax = torch.zeros(k)
        for a in range(0, n, _CHUNK):
            cmax = torch.maximum(cmax, rows(a).abs().amax(dim=0))
        in_scale = _column_scale(cmax)
    q, scale = torch.empty_like(qs), torch.empty(n)
    for a in range(0, n, _CHUNK):
        w = rows(a)
        q[a:a + _CHUNK], scale[a:a + _CHUNK] = _quantize_rows(w if in_scale is None else w / in_scale)
    return QuantizedLinear(q, scale, in_scale)


def dequantize(ql: QuantizedLinear) -> Tensor:
    """The f32 weight [N, K] the kernels compute with (up to activation rounding)."""
    w = ql.qweight.to(torch.float32) * ql.scale[:, None]
    return w if ql.in_scale is None else w * ql.in_scale


# ----------------------------------------------------------------------------- exact int8 GEMMs
def _fbgemm_pack(q: Tensor, scale: Tensor):
    """quantized::linear_prepack of [q | 0 0] (two zero columns for the pinned inputs)."""
    engine = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = "fbgemm"
        qp = torch.cat([q, torch.zeros(q.shape[0], 2, dtype=torch.int8)], 1)
        zp = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized-tensor creation is deprecated upstream
            qw = torch._make_per_channel_quantized_tensor(qp, scale.double(), zp, 0)
        return torch.ops.quantized.linear_prepack(qw, None)
    finally:
        torch.backends.quantized.engine = engine


def _gemm_fbgemm(xi: Tensor, packed) -> Tensor:
    """fl(acc * scale) for integer-valued f32 xi [R, K] in [-127, 127]: columns -128 and 127 pin
    the dynamic activation range, so fbgemm's scale is 1.0, its zero point 128, and its uint8
    quantization exact; the int32 accumulation is exact too."""
    r, k = xi.shape
    xp = torch.empty(r, k + 2)
    xp[:, :k] = xi
    xp[:, k] = -128.0
    xp[:, k + 1] = 127.0
    return torch.ops.quantized.linear_dynamic(xp, packed, False)


def _gemm_int_mm(xi: Tensor, q: Tensor, scale: Tensor) -> Tensor:
    return torch._int_mm(xi.to(torch.int8), q.t()).to(torch.float32) * scale


def _gemm(xi: Tensor, ql: QuantizedLinear, backend: str) -> Tensor:
    if backend == "fbgemm":
        pk = ql._cache.get("fbgemm")
        if pk is None:
            pk = ql._cache["fbgemm"] = _fbgemm_pack(ql.qweight, ql.scale)
        return _gemm_fbgemm(xi, pk)
    return _gemm_int_mm(xi, ql.qweight, ql.scale)


@functools.lru_cache(maxsize=None)
def exact_backends() -> tuple[str, ...]:
    """The exact-integer GEMM backends that reproduce int64 math on this CPU (checked once)."""
    g = torch.Generator().manual_seed(0)
    q = (torch.randint(0, 2, (48, 640), generator=g) * 254 - 127).to(torch.int8)  # saturating
    x = (torch.randint(0, 2, (6, 640), generator=g) * 254 - 127).float()
    x[1] = 127.0
    x[2, ::2] = 0.0
    ref = (x.double() @ q.double().t()).float()
    one = torch.ones(48)
    ok = []
    for name, fn in (("fbgemm", lambda: _gemm_fbgemm(x, _fbgemm_pack(q, one))),
                     ("int_mm", lambda: _gemm_int_mm(x, q, one))):
        try:
            if torch.equal(fn(), ref):
                ok.append(name)
        except Exception:  # noqa: BLE001 - op missing (fbgemm's API is deprecated upstream) or unsupported
            pass
    return tuple(ok)


def _act_planes(x: Tensor, levels: int) -> tuple[Tensor, list[Tensor]]:
    """x [M, K] f32 -> (integer-valued planes stacked [levels*M, K], per-row scales [M, 1] each)."""
    planes, scales, r = [], [], x
    for _ in range(levels):
        s = r.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 127.0
        p = torch.round(r / s).clamp_(-127, 127)
        planes.append(p)
        scales.append(s)
        r = r - p * s
    return (planes[0] if levels == 1 else torch.cat(planes)), scales


def auto_kernel(ql: QuantizedLinear) -> str:
    """The kernel linear(kernel="auto") uses for this weight (fixed per weight and process)."""
    ok = exact_backends()
    if ql.qweight.numel() < AUTO_LARGE or not ok:
        return "int8_bf16"
    return "fbgemm2" if "fbgemm" in ok else "int_mm2"


def linear(x: Tensor, ql: QuantizedLinear, *, kernel: str = "auto") -> Tensor:
    """y = x @ W.T for x [..., K] (f32 or bf16); returns [..., N] in x.dtype."""
    if x.shape[-1] != ql.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, weight expects {ql.in_features}")
    lead, dtype = x.shape[:-1], x.dtype
    x2 = x.reshape(-1, ql.in_features)
    m = x2.shape[0]
    if kernel == "auto":
        kernel = auto_kernel(ql)
    if ql.in_scale is not None:
        x2 = x2.to(torch.float32) * ql.in_scale
    if kernel in ("int8_bf16", "int8_f32"):
        dt = torch.bfloat16 if kernel == "int8_bf16" else torch.float32
        key = f"scale_{kernel}"
        s = ql._cache.get(key)
        if s is None:
            s = ql._cache[key] = ql.scale.to(dt)
        y = torch.ops.aten._weight_int8pack_mm(x2.to(dt).contiguous(), ql.qweight, s)
    elif kernel in ("int_mm", "fbgemm", "int_mm2", "fbgemm2"):
        levels = 2 if kernel.endswith("2") else 1
        xi, scales = _act_planes(x2.to(torch.float32), levels)
        o = _gemm(xi, ql, kernel.rstrip("2"))
        y = o * scales[0] if levels == 1 else o[:m] * scales[0] + o[m:] * scales[1]
    else:
        raise ValueError(f"unknown kernel {kernel!r}; expected 'auto' or one of {KERNELS}")
    return y.to(dtype).reshape(*lead, ql.out_features)
