"""The decode step's projections in CUDA C++ (MUSER_DOT_CPP; off by default: an experiment that
keeps dot_rows' bits and loses the step -- measured on an H100, benchmarks/NOTES.md and
RESULTS.md, thirty-ninth session).

Owns: building `csrc/gemv_mma.cu` (with its headers) with nvcc for sm_90a into
MUSER_CACHE_DIR/native/cuda (once per source digest; ~20 s), loading it (`load`, which warns
and returns None where it cannot: no nvcc, no sm_90 GPU, a failed build -- the Triton tiles
then run, with the same bits) and `CppDot`, the call (which of a step's projections the
kernel takes, with the ending dot_rows gives them: cpp_route.py).  The kernel keeps dot_rows'
decode-tile arithmetic -- each output the k16 MMA steps in order in mma.sync's own fragment
layout, the same three endings -- so a row's bits are the Triton tile's, hence the chunk
tiles' (tests/cuda/test_cpp_dot.py pins both); it changes only how bytes arrive (bulk copies
of a CTA's whole weight slab, asked for before the PDL wait), for bf16 weights and int8 rows
(quant="int8": half the bytes).  MUSER_DOT_CPP=norm also takes the add+norm before qkv and
gate|up into the projection (`norm_plan`, `CppDot.norm`): every CTA makes x from h and the
delta in add_norm's own reduction tree (csrc/triton_math.cuh) while its weights land, one CTA
stores h'.  Plain ctypes over a C entry point: no torch headers to compile against, so the
build is seconds and this module needs no compiler to import.  Does not own: when the step
asks (decode_step.DecodeStep._dot, step_norm.py), the Triton tiles (triton_dot.py), the tile
table's split-K pieces (triton_dot_tiles.dot_config: the arithmetic both follow).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import torch

from .cpp_route import GLU, NAMED, PLAIN, SPLIT, VARIANTS, norm_route, norm_shape, route
from .weights_int8 import RowInt8

CSRC = Path(__file__).with_name("csrc")
SRC = CSRC / "gemv_mma.cu"           # includes gemv_kernel.cuh, sm90.cuh, triton_math.cuh
def digest() -> str:
    """The sources' digest: the .cu and every header beside it."""
    h = hashlib.sha256()
    for f in sorted(CSRC.glob("*.cu*")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def build(cache_dir: Path, nvcc: str | None = None) -> Path:
    """csrc/gemv_mma.cu -> cache_dir/cuda/gemv_mma-<digest>.so (built once per source; the
    digest names the sources, so an edit rebuilds).  Raises RuntimeError naming what failed."""
    out = Path(cache_dir) / "cuda" / f"gemv_mma-{digest()}.so"
    if out.exists():
        return out
    nvcc = nvcc or shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
                                              / "bin" / "nvcc")
    if not Path(nvcc).exists():
        raise RuntimeError(f"no nvcc (looked for {nvcc})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [nvcc, "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
           "-o", str(tmp), str(SRC)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    os.replace(tmp, out)                 # whole or not at all: another process may be loading it
    return out


def weight_parts(w) -> tuple[torch.Tensor, torch.Tensor | None, int] | None:
    """(rows, scales or None, bytes a weight) of a projection's weight the kernel reads: a bf16
    matrix, or int8 rows with float32 scales (weights_int8.RowInt8); None for any other."""
    if isinstance(w, RowInt8):
        q, scale = w.q, w.scale
        ok = (q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.dim() == 1
              and scale.shape[0] == q.shape[0] and scale.is_contiguous())
        return (q, scale, 1) if ok else None
    return (w, None, 2) if w.dtype == torch.bfloat16 else None


class CppDot:
    """The built kernel: `cpp(x, w, n, plan, pdl)` on the current CUDA stream (captured
    into a graph like any launch).  `calls` counts launches, `norm_calls` the norm-in ones (tests
    check the route was taken)."""

    def __init__(self, lib: ctypes.CDLL, variant: str):
        lib.gemv_mma_launch.restype = ctypes.c_int
        lib.gemv_mma_launch.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_int] * 8 +
                                        [ctypes.c_void_p])
        lib.gemv_norm_launch.restype = ctypes.c_int
        lib.gemv_norm_launch.argtypes = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int] +
                                         [ctypes.c_void_p] * 4 + [ctypes.c_float] +
                                         [ctypes.c_int] * 2 + [ctypes.c_void_p] * 3 +
                                         [ctypes.c_int] * 7 + [ctypes.c_void_p])
        self.lib, self.variant, self.calls, self.norm_calls = lib, variant, 0, 0

    def plan(self, x: torch.Tensor, w, n: int, glu: bool, gelu: bool, piece: int,
             defer: bool) -> tuple[int, int, int, int] | None:
        """`route` for these operands: bf16 x [rows, K] and w [n (GLU: 2n), K] -- bf16, or int8
        rows (RowInt8) -- both contiguous and 16-byte aligned (the bulk copies' rule; a view
        that is not goes to the Triton tiles)."""
        parts = weight_parts(w)
        if (parts is None or x.dtype != torch.bfloat16 or x.dim() != 2
                or not (x.is_contiguous() and parts[0].is_contiguous())
                or x.data_ptr() % 16 or parts[0].data_ptr() % 16):
            return None
        return route(n, parts[0].shape[1], x.shape[0], glu, gelu, piece, defer, self.variant,
                     parts[2])

    def __call__(self, x: torch.Tensor, w, n: int, plan: tuple[int, int, int, int], pdl: bool,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """bf16 [rows, n] (PLAIN, GLU) or float32 pieces [pieces, rows, n] (SPLIT; int8 rows'
        pieces unscaled, as dot_rows' deferred pieces are), into `out` when given (contiguous,
        that shape and dtype)."""
        mode, ks, warps, nt = plan
        q, scale, _ = weight_parts(w)
        rows, k = x.shape
        if out is None and mode == SPLIT:
            out = torch.empty(-(-k // ks), rows, n, dtype=torch.float32, device=x.device)
        elif out is None:
            out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
        rc = self.lib.gemv_mma_launch(x.data_ptr(), q.data_ptr(),
                                      None if scale is None else scale.data_ptr(),
                                      out.data_ptr(), rows, n, k, ks, mode, warps, nt, int(pdl),
                                      torch.cuda.current_stream(x.device).cuda_stream)
        if rc:
            raise RuntimeError(f"gemv_mma_launch({rows} x {k} -> {n}, mode {mode}, {warps} "
                               f"warps x {nt}): {rc} (-1 shape, -2 shared memory, else CUDA)")
        self.calls += 1
        return out

    def norm_plan(self, h: torch.Tensor, d1, w_post: torch.Tensor | None,
                  w_next: torch.Tensor | None, w, n: int, glu: bool, gelu: bool,
                  piece: int, layernorm: bool) -> tuple[int, int, int, int] | None:
        """`norm_route` for add_norm(h, w_next, d1=d1, w_post=w_post) followed by this
        projection: bf16 h [rows, K]; d1 bf16 [rows, K] or unscaled pieces (triton_dot.Pieces
        of bf16 weights: float32 [P, rows, K] -- int8 rows' scaled pieces are summed by an
        add_norm compiled without FMA contraction, another tree); float32 norm weights [K];
        w [n (GLU: 2n), K] bf16 or int8 rows -- all contiguous and 16-byte aligned (bulk
        copies).  None: add_norm runs as before."""
        parts = weight_parts(w)
        if w_post is None or w_next is None or parts is None:
            return None
        w, _, wbytes = parts
        rows, k = h.shape
        part = d1.part if isinstance(d1, tuple) and d1.scale is None else d1
        if isinstance(part, tuple) or part is None:
            return None
        want = (torch.float32, 3) if part is not d1 else (torch.bfloat16, 2)
        if ((part.dtype, part.dim()) != want or tuple(part.shape[-2:]) != (rows, k)
                or h.dtype != torch.bfloat16 or w.shape[1] != k
                or any(t.dtype != torch.float32 or t.shape != (k,) for t in (w_post, w_next))
                or not all(t.is_contiguous() and t.data_ptr() % 16 == 0
                           for t in (h, part, w_post, w_next, w))):
            return None
        pieces = part.shape[0] if part.dim() == 3 else 0
        return norm_route(n, k, rows, glu, gelu, piece, pieces, self.variant, layernorm,
                          wbytes)

    def norm(self, h: torch.Tensor, d1, w_post: torch.Tensor, w_next: torch.Tensor, eps: float,
             w, n: int, plan: tuple[int, int, int, int], pdl: bool,
             h_out: torch.Tensor | None = None,
             x_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(h', y): add_norm's h' and the projection of its x, in one launch (`norm_plan`'s
        operands; h' into `h_out` when given; x also into `x_out` when given -- tests and
        probes, to see which norm parted from add_norm's)."""
        mode, _, warps, nt = plan
        q, scale, _ = weight_parts(w)
        rows, k = h.shape
        part = d1.part if isinstance(d1, tuple) else d1
        pieces = part.shape[0] if part.dim() == 3 else 0
        h_out = torch.empty_like(h) if h_out is None else h_out
        y = torch.empty(rows, n, dtype=h.dtype, device=h.device)
        tw, block = norm_shape(k)
        ptr = lambda t: None if t is None else t.data_ptr()                       # noqa: E731
        rc = self.lib.gemv_norm_launch(ptr(h), ptr(part), pieces, ptr(w_post), ptr(w_next),
                                       ptr(h_out), ptr(x_out), float(eps), tw, block, ptr(q),
                                       ptr(scale), ptr(y), rows, n, k, mode, warps, nt, int(pdl),
                                       torch.cuda.current_stream(h.device).cuda_stream)
        if rc:
            raise RuntimeError(f"gemv_norm_launch({rows} x {k} -> {n}, mode {mode}, {warps} "
                               f"warps x {nt}): {rc} (-1 shape, -2 shared memory, else CUDA)")
        self.calls += 1
        self.norm_calls += 1
        return h_out, y


def load(variant: str, cache_dir: Path, device: torch.device,
         nvcc: str | None = None) -> CppDot | None:
    """The kernel for MUSER_DOT_CPP=`variant` on `device`, or None with a RuntimeWarning that
    says why (the Triton tiles run instead, with the same bits)."""
    try:
        if variant not in NAMED and variant not in VARIANTS:
            raise RuntimeError(f"no CTA shape {variant!r} (on, norm or one of "
                               f"{', '.join(VARIANTS)})")
        if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
            raise RuntimeError(f"the kernel is built for sm_90 and the device is {device}")
        return CppDot(ctypes.CDLL(str(build(cache_dir, nvcc))), variant)
    except (RuntimeError, OSError) as e:
        warnings.warn(f"MUSER_DOT_CPP={variant}: {e}; the Triton tiles run instead",
                      RuntimeWarning, stacklevel=2)
        return None
