"""The decode step's projections in CUDA C++ (MUSER_DOT_CPP; off by default: an experiment until
the H200 has measured it -- benchmarks/NOTES.md, thirty-eighth session).

Owns: building `csrc/gemv_mma.cu` with nvcc for sm_90a into MUSER_CACHE_DIR/native/cuda (once
per source digest; ~2-10 s), loading it (`load`, which warns and returns None where it cannot:
no nvcc, no sm_90 GPU, a failed build -- the Triton tiles then run, with the same bits),
`route` (which of a step's projections the kernel takes: the same ending dot_rows gives them)
and `CppDot`, the call.  The kernel keeps dot_rows' decode-tile arithmetic -- each output the
k16 MMA steps in order in mma.sync's own fragment layout, the same three endings -- so a row's
bits are the Triton tile's, hence the chunk tiles' (tests/cuda/test_cpp_dot.py pins both);
it changes only how bytes arrive (bulk copies of a CTA's whole weight slab, asked for before
the PDL wait).  Plain ctypes over a C entry point: no torch headers to compile against, so the
build is seconds and this module needs no compiler to import.  Does not own: when the step
asks (decode_step.DecodeStep._dot), the Triton tiles (triton_dot.py), the tile table's split-K
pieces (triton_dot_tiles.dot_config: the arithmetic both follow).
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

SRC = Path(__file__).with_name("csrc") / "gemv_mma.cu"
PLAIN, GLU, SPLIT = 0, 1, 2          # the kernel's three endings (gemv_mma.cu `Mode`)
MAX_ROWS = 16                        # one m16 tile of rows: a decode step's batch, a verify block
SMEM = 227 * 1024                    # an sm_90 CTA's shared memory
VARIANTS = ("11", "21", "41", "12", "22")    # warps a CTA, n8 tiles a warp (the .cu's cases)


def smem_bytes(mode: int, warps: int, nt: int, rows: int, ks: int) -> int:
    """A CTA's shared memory: 64 bytes of mbarriers, then 8 * nt * warps weight rows (twice, gate
    and up, for GLU) and the x rows, each 2 * ks + 16 bytes (the skew that spreads the banks)."""
    halves = 2 if mode == GLU else 1
    return 64 + (halves * 8 * nt * warps + rows) * (2 * ks + 16)


def route(n: int, k: int, rows: int, glu: bool, gelu: bool, piece: int, defer: bool,
          variant: str) -> tuple[int, int, int, int] | None:
    """(mode, keys a piece, warps, n8 tiles a warp) for a projection the kernel can take with
    dot_rows' bits, else None.  n: output columns (GLU: of each half); piece: the tile table's
    split-K piece (0: none) -- a split projection only as unsummed pieces (`defer`, the add+norm
    after it sums them: MUSER_FUSE_SUM), gate|up only with GELU (the one act the .cu carries).
    variant "on": 2 warps x 1 n8 tile, else 1 x 1, whichever fits shared memory first."""
    if rows < 1 or rows > MAX_ROWS or n % 8 or k % 64:
        return None
    if glu:
        if not gelu or piece:
            return None
        mode, ks = GLU, k
    elif piece:
        if not defer or piece % 64 or (k % piece) % 64:
            return None
        mode, ks = SPLIT, piece
    else:
        mode, ks = PLAIN, k
    shapes = ("21", "11") if variant == "on" else (variant,)
    for v in shapes:
        warps, nt = int(v[0]), int(v[1])
        if smem_bytes(mode, warps, nt, rows, ks) <= SMEM:
            return mode, ks, warps, nt
    return None


def build(cache_dir: Path, nvcc: str | None = None) -> Path:
    """csrc/gemv_mma.cu -> cache_dir/cuda/gemv_mma-<digest>.so (built once per source; the
    digest names the source, so an edit rebuilds).  Raises RuntimeError naming what failed."""
    src = SRC.read_bytes()
    out = Path(cache_dir) / "cuda" / f"gemv_mma-{hashlib.sha256(src).hexdigest()[:16]}.so"
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


class CppDot:
    """The built kernel: `cpp(x, w, out, n, plan, pdl)` on the current CUDA stream (captured
    into a graph like any launch).  `calls` counts launches (tests check the route was taken)."""

    def __init__(self, lib: ctypes.CDLL, variant: str):
        lib.gemv_mma_launch.restype = ctypes.c_int
        lib.gemv_mma_launch.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int] * 8 +
                                        [ctypes.c_void_p])
        self.lib, self.variant, self.calls = lib, variant, 0

    def plan(self, x: torch.Tensor, w: torch.Tensor, n: int, glu: bool, gelu: bool, piece: int,
             defer: bool) -> tuple[int, int, int, int] | None:
        """`route` for these operands: bf16 x [rows, K] and w [n (GLU: 2n), K], both contiguous
        and 16-byte aligned (the bulk copies' rule; a view that is not goes to the Triton
        tiles)."""
        if (x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or x.dim() != 2
                or not (x.is_contiguous() and w.is_contiguous())
                or x.data_ptr() % 16 or w.data_ptr() % 16):
            return None
        return route(n, w.shape[1], x.shape[0], glu, gelu, piece, defer, self.variant)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, n: int,
                 plan: tuple[int, int, int, int], pdl: bool,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """bf16 [rows, n] (PLAIN, GLU) or float32 pieces [pieces, rows, n] (SPLIT), into `out`
        when given (contiguous, that shape and dtype)."""
        mode, ks, warps, nt = plan
        rows, k = x.shape
        if out is None and mode == SPLIT:
            out = torch.empty(-(-k // ks), rows, n, dtype=torch.float32, device=x.device)
        elif out is None:
            out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
        rc = self.lib.gemv_mma_launch(x.data_ptr(), w.data_ptr(), out.data_ptr(), rows, n, k,
                                      ks, mode, warps, nt, int(pdl),
                                      torch.cuda.current_stream(x.device).cuda_stream)
        if rc:
            raise RuntimeError(f"gemv_mma_launch({rows} x {k} -> {n}, mode {mode}, {warps} "
                               f"warps x {nt}): {rc} (-1 shape, -2 shared memory, else CUDA)")
        self.calls += 1
        return out


def load(variant: str, cache_dir: Path, device: torch.device,
         nvcc: str | None = None) -> CppDot | None:
    """The kernel for MUSER_DOT_CPP=`variant` on `device`, or None with a RuntimeWarning that
    says why (the Triton tiles run instead, with the same bits)."""
    try:
        if variant != "on" and variant not in VARIANTS:
            raise RuntimeError(f"no CTA shape {variant!r} (on or one of {', '.join(VARIANTS)})")
        if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
            raise RuntimeError(f"the kernel is built for sm_90 and the device is {device}")
        return CppDot(ctypes.CDLL(str(build(cache_dir, nvcc))), variant)
    except (RuntimeError, OSError) as e:
        warnings.warn(f"MUSER_DOT_CPP={variant}: {e}; the Triton tiles run instead",
                      RuntimeWarning, stacklevel=2)
        return None
