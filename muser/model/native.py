"""Native CPU kernels' tensor wrappers, called through ctypes (the library: native_build.py).

Owns: thin tensor wrappers over the compiled kernels: `BoundA8W8` (every projection of the
int8 path: exact integer sums, `a8w8_reference` is its arithmetic in torch), `q8_linear` /
`BoundQ8` (the f32-activation int8 GEMV: the LM head), `norm_rope`, `attend_rows` (attention
by absolute position: decode, verification and prefill rows alike) and `attend_visible` /
`try_attend_visible` (every key visible, for callers without positions).  Does not own:
building or loading the library (native_build.py: `available()` is its answer), when a kernel
is used (quantize.FastLinear and the engine decide) or the kernels' maths (each C file).
"""
from __future__ import annotations

import ctypes

import torch

from .native_build import available, library

__all__ = ["available", "library", "BoundQ8", "q8_linear", "BoundA8W8", "a8w8_reference",
           "norm_rope", "attend_supported", "try_attend_visible", "attend_visible", "attend_rows"]


_FLOATS = (torch.float32, torch.bfloat16)


def _lib(lib: ctypes.CDLL | None = None) -> ctypes.CDLL:
    lib = lib or library()
    if lib is None:
        raise RuntimeError("muser native kernels are not available (no C compiler, or MUSER_NATIVE=0)")
    return lib


def _rows(x: torch.Tensor, k: int, out_dtype: torch.dtype) -> torch.Tensor:
    """A native linear's input checked ([M, k] float32 / bfloat16 on the CPU, a float output
    dtype) and made contiguous."""
    if x.dim() != 2 or x.shape[1] != k or x.dtype not in _FLOATS or x.device.type != "cpu":
        raise ValueError(f"x must be a 2-D float32/bfloat16 CPU tensor [M, {k}], got {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}")
    if out_dtype not in _FLOATS:
        raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    return x if x.is_contiguous() else x.contiguous()


class BoundQ8:
    """`q8_linear` with the weight operands checked once: a decode step calls it ~70 times,
    so per call only x is checked.  Holds references to the weight tensors it points at."""

    __slots__ = ("n", "k", "_f", "_ptrs", "_keep")

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, in_scale: torch.Tensor | None = None,
                 lib: ctypes.CDLL | None = None):
        n, k = qweight.shape if qweight.dim() == 2 else (-1, -1)
        if qweight.dtype != torch.int8 or n < 1 or not qweight.is_contiguous() or qweight.device.type != "cpu":
            raise ValueError(f"qweight must be a contiguous 2-D int8 CPU tensor, got {qweight.dtype} "
                             f"{tuple(qweight.shape)} on {qweight.device}")
        for name, t, size in (("scale", scale, n), ("in_scale", in_scale, k)):
            if t is not None and (t.dtype != torch.float32 or t.shape != (size,) or not t.is_contiguous()):
                raise ValueError(f"{name} must be contiguous float32 [{size}], got {t.dtype} {tuple(t.shape)}")
        self.n, self.k, self._f = n, k, _lib(lib).muser_q8_linear
        self._ptrs = (qweight.data_ptr(), scale.data_ptr(), None if in_scale is None else in_scale.data_ptr())
        self._keep = (qweight, scale, in_scale)

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        x = _rows(x, self.k, out_dtype)
        m = x.shape[0]
        y = torch.empty((m, self.n), dtype=out_dtype)
        w, s, i = self._ptrs
        if self._f(x.data_ptr(), x.dtype is torch.bfloat16, m, self.k, w, s, i, self.n, y.data_ptr(),
                   out_dtype is torch.bfloat16, torch.get_num_threads()) != 0:
            raise MemoryError(f"q8_linear: could not allocate {m * self.k * 4} bytes of scratch")
        return y


def q8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
              in_scale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
              lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [M, K] f32/bf16, qweight int8 [N, K], scale f32 [N], in_scale f32 [K] or None
    -> y [M, N] in `out_dtype` (default x's dtype): y = ((x * in_scale) @ qweight.T) * scale."""
    return BoundQ8(qweight, scale, in_scale, lib)(x, out_dtype or x.dtype)


class BoundA8W8:
    """The exact-integer linear (csrc/a8w8.c) over weights packed once: y = x @ W.T with
    W = qweight * scale[:, None], x quantized per row to two int8 planes inside the call.
    Row-, thread- and tiling-invariant by construction; `a8w8_reference` is the same
    arithmetic in torch, bit for bit."""

    __slots__ = ("n", "k", "_f", "_packed", "_scale")

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, lib: ctypes.CDLL | None = None):
        n, k = qweight.shape if qweight.dim() == 2 else (-1, -1)
        if qweight.dtype != torch.int8 or n < 1 or not qweight.is_contiguous() or qweight.device.type != "cpu":
            raise ValueError(f"qweight must be a contiguous 2-D int8 CPU tensor, got {qweight.dtype} "
                             f"{tuple(qweight.shape)} on {qweight.device}")
        if scale.dtype != torch.float32 or scale.shape != (n,) or not scale.is_contiguous():
            raise ValueError(f"scale must be contiguous float32 [{n}], got {scale.dtype} {tuple(scale.shape)}")
        if int(qweight.min()) < -127:
            raise ValueError("qweight must lie in [-127, 127] (symmetric int8)")
        lib = _lib(lib)
        self.n, self.k, self._f = n, k, lib.muser_a8w8_linear
        self._packed = torch.empty(lib.muser_a8w8_packed_bytes(n, k), dtype=torch.uint8)
        lib.muser_a8w8_pack(qweight.data_ptr(), n, k, self._packed.data_ptr())
        self._scale = scale

    def nbytes(self) -> int:
        return self._packed.nbytes + self._scale.nbytes

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        x = _rows(x, self.k, out_dtype)
        m = x.shape[0]
        y = torch.empty((m, self.n), dtype=out_dtype)
        if self._f(x.data_ptr(), x.dtype is torch.bfloat16, m, self.k, self._packed.data_ptr(),
                   self._scale.data_ptr(), self.n, y.data_ptr(), out_dtype is torch.bfloat16,
                   torch.get_num_threads()) != 0:
            raise MemoryError(f"a8w8_linear: could not allocate {2 * m * self.k} bytes of scratch")
        return y


def a8w8_reference(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """csrc/a8w8.c's arithmetic in torch (exact int64 sums, the same element-wise float steps):
    the bitwise reference its tests compare against.  x [M, K] -> [M, N]."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True)
    inv = torch.tensor(127.0) / amax
    s1 = amax / torch.tensor(127.0)
    q1 = torch.round(xf * inv).clamp_(-127, 127)
    r = xf - q1 * s1
    q2 = torch.round(r * (inv * 256.0)).clamp_(-127, 127)
    s2 = s1 / 256.0
    w = qweight.long().T
    a1 = (q1.long() @ w).float()                              # exact sums, then int -> float (RNE)
    a2 = (q2.long() @ w).float()
    y = (a1 * s1 + a2 * s2) * scale
    y = torch.where(amax == 0, torch.zeros_like(y), y)
    return y.to(out_dtype or x.dtype)


def norm_rope(x: torch.Tensor, w: torch.Tensor | None, eps: float, cos: torch.Tensor | None = None,
              sin: torch.Tensor | None = None, interleaved: bool = False,
              out_dtype: torch.dtype | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """RMS norm over the last dim (when `w` is given) then RoPE (when `cos`/`sin` [T, D/2] are given),
    in float32.  x [T, D] or [T, N, D] (rows may be strided, heads contiguous), f32 or bf16
    -> contiguous, same shape, `out_dtype` (default x's dtype).  Called ~110 times per decode
    step: the checks are written to be cheap."""
    shape, stride = x.shape, x.stride()
    three = len(shape) == 3
    if not three and len(shape) != 2 or x.dtype not in _FLOATS or x.device.type != "cpu":
        raise ValueError(f"x must be a [T, D] or [T, N, D] float32/bfloat16 CPU tensor, got {x.dtype} "
                         f"{tuple(shape)} on {x.device}")
    t, n, d = shape if three else (shape[0], 1, shape[1])
    if stride[-1] != 1 or (three and n > 1 and stride[1] != d):
        x = x.contiguous()
        stride = x.stride()
    ptrs = []
    for name, tab, want in (("w", w, (d,)), ("cos", cos, (t, d // 2)), ("sin", sin, (t, d // 2))):
        if tab is None:
            ptrs.append(None)
        elif tab.dtype is torch.float32 and tab.shape == want and tab.is_contiguous():
            ptrs.append(tab.data_ptr())
        else:
            raise ValueError(f"{name} must be contiguous float32 {list(want)}, got {tab.dtype} {tuple(tab.shape)}")
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin go together")
    out_dtype = out_dtype or x.dtype
    y = torch.empty(shape, dtype=out_dtype)
    if _lib(lib).muser_norm_rope(x.data_ptr(), x.dtype is torch.bfloat16, t, n, d, stride[0], ptrs[0],
                              eps, ptrs[1], ptrs[2], interleaved, y.data_ptr(),
                              out_dtype is torch.bfloat16, torch.get_num_threads()) != 0:
        raise ValueError(f"norm_rope: unsupported head size {d}")
    return y


def attend_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attend_visible` takes these operands as they are (no copy)."""
    return (q.dtype in _FLOATS and k.dtype == v.dtype and k.dtype in _FLOATS
            and k.stride() == v.stride() and k.stride(2) == 1
            and q.shape[-1] % 16 == 0 and q.shape[-1] <= 1024
            and q.shape[1] % k.shape[1] == 0 and q.shape[1] // k.shape[1] <= 16
            and q.device.type == "cpu" and k.device.type == "cpu" and library() is not None)


def try_attend_visible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                       softcap: float | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor | None:
    """`attend_visible`, or None when the operands are not supported (checked once: the
    decode step's attention asks this 18 times a token)."""
    if not attend_supported(q, k, v):
        return None
    t, h, d = q.shape
    s, kv, _ = k.shape
    q = q.contiguous()
    out = torch.empty((t, h, d), dtype=q.dtype)
    rc = _lib(lib).muser_attend_visible(
        q.data_ptr(), q.dtype is torch.bfloat16, t, h, d, k.data_ptr(), v.data_ptr(),
        k.dtype is torch.bfloat16, s, kv, k.stride(0), k.stride(1), float(scale),
        float(softcap or 0.0), out.data_ptr(), q.dtype is torch.bfloat16, torch.get_num_threads())
    if rc == -2:
        raise MemoryError(f"attend_visible: could not allocate {s} scores")
    if rc != 0:
        raise ValueError(f"attend_visible: unsupported shape q {tuple(q.shape)} k {tuple(k.shape)}")
    return out


def attend_visible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   softcap: float | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Attention with every key visible.  q [T, H, D], k/v [S, KV, D] (any strides with the
    head dim contiguous and k, v laid out alike) -> [T, H, D] in q's dtype (float32 maths)."""
    out = try_attend_visible(q, k, v, scale, softcap, lib)
    if out is None:
        raise ValueError(f"attend_visible: unsupported operands q {q.dtype} {tuple(q.shape)}, "
                         f"k {k.dtype} {tuple(k.shape)} strides {k.stride()}, v strides {v.stride()}")
    return out


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions, window: int | None,
                key_pos0: int, scale: float, softcap: float | None = None, count: int | None = None,
                rotation: int = 0, lib: ctypes.CDLL | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of query rows at absolute positions over keys addressed by position
    (csrc/attend.c: one arithmetic per row, whatever the call).

    q [T, H, D] (f32/bf16); `positions`: int64 [T] tensor, or an int p0 for rows p0 .. p0+T-1.
    Row t sees the keys at [max(0, p - window + 1), p] (window None: [0, p]).
    k/v [cap, KV, D] with the head dim contiguous (any row / head strides, k and v alike):
    key position j is row (rotation + j - key_pos0) % cap; `count` keys from key_pos0 are
    held (default cap).  `sinks`: float32 [H] logits joining each head's softmax denominator
    (gpt-oss), or None.  Returns [T, H, D] in q's dtype."""
    if not attend_supported(q, k, v):
        raise ValueError(f"attend_rows: unsupported operands q {q.dtype} {tuple(q.shape)}, "
                         f"k {k.dtype} {tuple(k.shape)} strides {k.stride()}, v strides {v.stride()}")
    t, h, d = q.shape
    cap, kv, _ = k.shape
    if isinstance(positions, int):
        pos, pos_ptr, first = None, None, positions              # rows at positions .. positions + t - 1
    else:
        pos = positions.to(torch.int64).contiguous()
        if pos.shape != (t,):
            raise ValueError(f"positions must be int64 [{t}], got {tuple(pos.shape)}")
        pos_ptr, first = pos.data_ptr(), 0
    q = q.contiguous()
    out = torch.empty((t, h, d), dtype=q.dtype)
    n = cap if count is None else count
    common = (q.data_ptr(), q.dtype is torch.bfloat16, t, h, d, pos_ptr, first, int(window or 0),
              k.data_ptr(), v.data_ptr(), k.dtype is torch.bfloat16, kv, int(key_pos0), n, int(rotation), cap,
              k.stride(0), k.stride(1), float(scale), float(softcap or 0.0))
    tail = (out.data_ptr(), q.dtype is torch.bfloat16, torch.get_num_threads())
    if sinks is None:
        rc = _lib(lib).muser_attend_rows(*common, *tail)
    else:
        sinks = sinks.to(torch.float32).contiguous()
        if sinks.shape != (h,):
            raise ValueError(f"sinks must be float32 [{h}], got {tuple(sinks.shape)}")
        rc = _lib(lib).muser_attend_rows_sinks(*common, sinks.data_ptr(), *tail)
    if rc == -2:
        raise MemoryError("attend_rows: could not allocate its scratch")
    if rc != 0:
        lo, hi = (first, first + t - 1) if pos is None else (int(pos.min()), int(pos.max()))
        raise ValueError(f"attend_rows: rows at positions {lo}..{hi} (window {window}) "
                         f"need keys the source does not hold (keys {key_pos0}..{key_pos0 + n - 1}, "
                         f"capacity {cap}, rotation {rotation}), or an unsupported shape q {tuple(q.shape)}")
    return out
