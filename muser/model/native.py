"""Native CPU kernels: built on first use with the system C compiler, called through ctypes.

Owns: compiling `csrc/*.c` into a shared library cached under
~/.cache/muser/native (keyed by the source, the compiler and the CPU flags, so
a changed file or another machine gets its own build), loading it, and thin
tensor wrappers (`q8_linear`, `norm_rope`, `attend_visible`).  Does not own: when a kernel is used
(quantize.FastLinear decides) or the kernels' maths (documented in the C file).

Why ctypes and not a torch extension: the build needs only `cc` (about a
second, no torch headers, no ninja), and loading the library after torch makes
its `#pragma omp` regions run on torch's own OpenMP pool (same libgomp soname),
so the two never fight over the two cores.  No compiler, or MUSER_NATIVE=0:
`available()` is False and callers keep the aten kernels.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

SOURCES = ("q8_linear.c", "norm_rope.c", "attend.c")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    root = os.environ.get("MUSER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "muser")
    return Path(root) / "native"


def _build() -> Path | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src_dir = Path(__file__).with_name("csrc")
    sources = [src_dir / s for s in SOURCES]
    key = hashlib.sha256()
    for s in sources:
        key.update(s.read_bytes())
    key.update(" ".join((cc, *CFLAGS, _cpu_flags(), torch.__version__)).encode())
    out = _cache_dir() / f"muser_native_{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)   # build aside, then rename: atomic
    os.close(fd)
    try:
        subprocess.run([cc, *CFLAGS, *map(str, sources), "-o", tmp], check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.replace(tmp, out)
    except (OSError, subprocess.CalledProcessError):
        Path(tmp).unlink(missing_ok=True)
        return None
    return out


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (no compiler, a failed build, or MUSER_NATIVE=0)."""
    if os.environ.get("MUSER_NATIVE", "1") == "0":
        return None
    path = _build()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    f = lib.muser_q8_linear
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                  ctypes.c_int]
    g = lib.muser_norm_rope
    g.restype = ctypes.c_int
    g.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    a = lib.muser_attend_visible
    a.restype = ctypes.c_int
    a.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_void_p,
                  ctypes.c_int, ctypes.c_int]
    return lib


def available() -> bool:
    return library() is not None


def q8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
              in_scale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] f32/bf16, qweight int8 [N, K], scale f32 [N], in_scale f32 [K] or None
    -> y [M, N] in `out_dtype` (default x's dtype): y = ((x * in_scale) @ qweight.T) * scale."""
    lib = library()
    if lib is None:
        raise RuntimeError("muser native kernels are not available (no C compiler, or MUSER_NATIVE=0)")
    if x.dtype not in (torch.float32, torch.bfloat16) or x.dim() != 2:
        raise ValueError(f"x must be 2-D float32 or bfloat16, got {x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    n = qweight.shape[0]
    if qweight.dtype != torch.int8 or qweight.shape != (n, k) or not qweight.is_contiguous():
        raise ValueError(f"qweight must be contiguous int8 [N, {k}], got {qweight.dtype} {tuple(qweight.shape)}")
    for name, t, size in (("scale", scale, n), ("in_scale", in_scale, k)):
        if t is not None and (t.dtype != torch.float32 or t.shape != (size,) or not t.is_contiguous()):
            raise ValueError(f"{name} must be contiguous float32 [{size}], got {t.dtype} {tuple(t.shape)}")
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    x = x.contiguous()
    y = torch.empty((m, n), dtype=out_dtype)
    rc = lib.muser_q8_linear(x.data_ptr(), int(x.dtype == torch.bfloat16), m, k, qweight.data_ptr(),
                             scale.data_ptr(), None if in_scale is None else in_scale.data_ptr(), n,
                             y.data_ptr(), int(out_dtype == torch.bfloat16), torch.get_num_threads())
    if rc != 0:
        raise MemoryError(f"q8_linear: could not allocate {m * k * 4} bytes of scratch")
    return y


def norm_rope(x: torch.Tensor, w: torch.Tensor | None, eps: float, cos: torch.Tensor | None = None,
              sin: torch.Tensor | None = None, interleaved: bool = False,
              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMS norm over the last dim (when `w` is given) then RoPE (when `cos`/`sin` [T, D/2] are given),
    in float32.  x [T, D] or [T, N, D] (rows may be strided, heads contiguous), f32 or bf16
    -> contiguous, same shape, `out_dtype` (default x's dtype)."""
    lib = library()
    if lib is None:
        raise RuntimeError("muser native kernels are not available (no C compiler, or MUSER_NATIVE=0)")
    if x.dtype not in (torch.float32, torch.bfloat16) or x.dim() not in (2, 3):
        raise ValueError(f"x must be [T, D] or [T, N, D] float32/bfloat16, got {x.dtype} {tuple(x.shape)}")
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    t, n, d = x3.shape
    if x3.stride(2) != 1 or (n > 1 and x3.stride(1) != d):
        x3 = x3.contiguous()
    tables = []
    for name, tab in (("w", w), ("cos", cos), ("sin", sin)):
        want = (d,) if name == "w" else (t, d // 2)
        if tab is not None and (tab.dtype != torch.float32 or tab.shape != want or not tab.is_contiguous()):
            raise ValueError(f"{name} must be contiguous float32 {list(want)}, got {tab.dtype} {tuple(tab.shape)}")
        tables.append(None if tab is None else tab.data_ptr())
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin go together")
    out_dtype = out_dtype or x.dtype
    y = torch.empty((t, n, d), dtype=out_dtype)
    rc = lib.muser_norm_rope(x3.data_ptr(), int(x3.dtype == torch.bfloat16), t, n, d, x3.stride(0),
                             tables[0], float(eps), tables[1], tables[2], int(interleaved), y.data_ptr(),
                             int(out_dtype == torch.bfloat16), torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"norm_rope: unsupported head size {d}")
    return y if x.dim() == 3 else y.squeeze(1)


def attend_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attend_visible` takes these operands as they are (no copy)."""
    return (q.dtype in (torch.float32, torch.bfloat16) and k.dtype == v.dtype
            and k.dtype in (torch.float32, torch.bfloat16) and k.stride() == v.stride()
            and k.stride(2) == 1 and q.shape[-1] % 16 == 0 and q.shape[-1] <= 1024
            and q.device.type == "cpu" and k.device.type == "cpu" and library() is not None)


def attend_visible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   softcap: float | None = None) -> torch.Tensor:
    """Attention with every key visible.  q [T, H, D], k/v [S, KV, D] (any strides with the
    head dim contiguous and k, v laid out alike) -> [T, H, D] in q's dtype (float32 maths)."""
    if not attend_supported(q, k, v):
        raise ValueError(f"attend_visible: unsupported operands q {q.dtype} {tuple(q.shape)}, "
                         f"k {k.dtype} {tuple(k.shape)} strides {k.stride()}, v strides {v.stride()}")
    t, h, d = q.shape
    s, kv, _ = k.shape
    q = q.contiguous()
    out = torch.empty((t, h, d), dtype=q.dtype)
    rc = library().muser_attend_visible(
        q.data_ptr(), int(q.dtype == torch.bfloat16), t, h, d, k.data_ptr(), v.data_ptr(),
        int(k.dtype == torch.bfloat16), s, kv, k.stride(0), k.stride(1), float(scale),
        float(softcap or 0.0), out.data_ptr(), int(q.dtype == torch.bfloat16), torch.get_num_threads())
    if rc == -2:
        raise MemoryError(f"attend_visible: could not allocate {s} scores")
    if rc != 0:
        raise ValueError(f"attend_visible: unsupported shape q {tuple(q.shape)} k {tuple(k.shape)}")
    return out
