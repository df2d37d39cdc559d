"""The decode step's projections in CUDA C++ (MUSER_DOT_CPP; off by default: an experiment that
keeps dot_rows' bits and loses the step -- measured on an H100, benchmarks/NOTES.md and
RESULTS.md, thirty-ninth session).

Owns: building `csrc/gemv_mma.cu` (with its headers) with nvcc for sm_90a into
MUSER_CACHE_DIR/native/cuda (once per source digest; ~20 s), loading it (`load`, which warns
and returns None where it cannot: no nvcc, no sm_90 GPU, a failed build -- the Triton tiles
then run, with the same bits), `route` (which of a step's projections the kernel takes: the
same ending dot_rows gives them) and `CppDot`, the call.  The kernel keeps dot_rows'
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

from .weights_int8 import RowInt8

CSRC = Path(__file__).with_name("csrc")
SRC = CSRC / "gemv_mma.cu"           # includes gemv_kernel.cuh, sm90.cuh, triton_math.cuh
PLAIN, GLU, SPLIT = 0, 1, 2          # the kernel's three endings (gemv_mma.cu `Mode`)
MAX_ROWS = 16                        # one m16 tile of rows: a decode step's batch, a verify block
SMEM = 227 * 1024                    # an sm_90 CTA's shared memory
VARIANTS = ("11", "21", "41", "12", "22")    # warps a CTA, n8 tiles a warp (the .cu's cases)
NAMED = ("on", "norm")                       # 2 x 1, else 1 x 1; norm: with the add+norm in


def cta_shapes(variant: str) -> tuple[str, ...]:
    """The CTA shapes (warps, n8 tiles a warp) a variant tries, in order: on / norm 2 x 1 then
    1 x 1 (shared memory may be short), else the one it names."""
    return ("21", "11") if variant in NAMED else (variant,)


def norm_bytes(rows: int, k: int, pieces: int) -> int:
    """Shared memory a norm-in launch stages its inputs in (gemv_mma.cu `norm_bytes`): w_post
    and w_next float32 [k], h bf16 [rows, k], d1 bf16 [rows, k] or float32 [pieces, rows, k]."""
    return 8 * k + 2 * rows * k + (4 * pieces * rows * k if pieces else 2 * rows * k)


def smem_bytes(mode: int, warps: int, nt: int, rows: int, ks: int, wbytes: int = 2) -> int:
    """A CTA's shared memory: 128 bytes of mbarriers and the norm's scratch, then 8 * nt * warps
    weight rows (twice, gate and up, for GLU) of wbytes * ks + 16 bytes (int8 rows: 1 byte a
    weight) and the x rows of 2 * ks + 16 (the 16: the skew that spreads the banks)."""
    halves = 2 if mode == GLU else 1
    return 128 + halves * 8 * nt * warps * (wbytes * ks + 16) + rows * (2 * ks + 16)


def route(n: int, k: int, rows: int, glu: bool, gelu: bool, piece: int, defer: bool,
          variant: str, wbytes: int = 2) -> tuple[int, int, int, int] | None:
    """(mode, keys a piece, warps, n8 tiles a warp) for a projection the kernel can take with
    dot_rows' bits, else None.  n: output columns (GLU: of each half); piece: the tile table's
    split-K piece (0: none) -- a split projection only as unsummed pieces (`defer`, the add+norm
    after it sums them: MUSER_FUSE_SUM), gate|up only with GELU (the one act the .cu carries).
    variant "on" / "norm": 2 warps x 1 n8 tile, else 1 x 1, whichever fits shared memory
    first; wbytes: 1 for int8 rows."""
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
    for v in cta_shapes(variant):
        warps, nt = int(v[0]), int(v[1])
        if smem_bytes(mode, warps, nt, rows, ks, wbytes) <= SMEM:
            return mode, ks, warps, nt
    return None


def norm_shape(k: int) -> tuple[int, int]:
    """(warps, BLOCK) of add_norm over rows of k keys (triton_ops._row_shape: they fix its
    reduction tree, which the kernel replays)."""
    block = 1 << max(k - 1, 0).bit_length()
    return (8 if k >= 2048 else 4), block


def norm_route(n: int, k: int, rows: int, glu: bool, gelu: bool, piece: int, pieces: int,
               variant: str, layernorm: bool, wbytes: int = 2) -> tuple[int, int, int, int] | None:
    """`route` for a projection that makes its own x (MUSER_DOT_CPP=norm): a whole-K one (qkv,
    gate|up; `piece`: the tile table's split, which must be none), an RMS norm whose BLOCK
    gives a Triton thread at least 8 keys (the layout csrc/triton_math.cuh replays: BLOCK >=
    8 x 32 x warps, so k > 512), and shared memory for the staged inputs too
    (`pieces`: the delta's split-K pieces, 0 for a bf16 delta), else None."""
    tw, block = norm_shape(k)
    if layernorm or block < 8 * 32 * tw or piece:
        return None
    glu_mode = GLU if glu else PLAIN
    for v in cta_shapes(variant):
        plan = route(n, k, rows, glu, gelu, 0, False, v, wbytes)
        if (plan is not None and plan[2] <= tw and plan[0] == glu_mode and
                smem_bytes(glu_mode, plan[2], plan[3], rows, k, wbytes) +
                norm_bytes(rows, k, pieces) <= SMEM):
            return plan
    return None


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
