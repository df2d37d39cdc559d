"""The native CPU kernels' library: built on first use with the system C compiler, loaded by ctypes.

Owns: compiling `csrc/*.c` into a shared library cached under $MUSER_CACHE_DIR/native (keyed
by the sources, the compiler, its flags and the CPU's, so a changed file or another machine
gets its own build), loading it with every function's signature declared, and `available()`.
Does not own: the tensor wrappers (native.py) or the kernels' maths (each C file).

Why ctypes and not a torch extension: the build needs only `cc` (about a second, no torch
headers, no ninja), and loading the library after torch makes its `#pragma omp` regions run on
torch's own OpenMP pool (same libgomp soname), so the two never fight over the two cores.  No
compiler, or MUSER_NATIVE=0: `available()` is False and callers keep the aten kernels.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path

import torch

SOURCES = ("q8_linear.c", "a8w8.c", "norm_rope.c", "attend.c")
# -ffp-contract=off: no a*b+c fused behind the source's back, so vector and scalar code paths
# (and the torch reference of a8w8) compute the same bits.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11", "-ffp-contract=off")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    from ..env import read
    return read().native_dir            # $MUSER_CACHE_DIR/native


def build(extra_flags: tuple[str, ...] = ()) -> Path | None:
    """Compile the kernels (or find the cached build); None without a working compiler.
    `extra_flags` (e.g. -mno-avx512f, to test the portable paths) get their own build."""
    flags = (*CFLAGS, *extra_flags)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src_dir = Path(__file__).with_name("csrc")
    sources = [src_dir / s for s in SOURCES]
    key = hashlib.sha256()
    for s in sorted(src_dir.glob("*.[ch]")):           # sources and the header they share
        key.update(s.name.encode() + s.read_bytes())
    key.update(" ".join((cc, *flags, _cpu_flags(), torch.__version__)).encode())
    out = _cache_dir() / f"muser_native_{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)   # build aside, then rename: atomic
        os.close(fd)
        subprocess.run([cc, *flags, *map(str, sources), "-o", tmp], check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.replace(tmp, out)
    except (OSError, subprocess.CalledProcessError) as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        detail = e.stderr.decode(errors="replace")[-500:] if isinstance(e, subprocess.CalledProcessError) else e
        warnings.warn(f"muser: the native CPU kernels did not build with {cc} {' '.join(extra_flags)}: "
                      f"{detail}; using PyTorch's kernels (slower, same contract)", RuntimeWarning)
        return None
    return out


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (no compiler, a failed build, or MUSER_NATIVE=0)."""
    from ..env import read
    if not read().native:
        return None
    path = build()
    return None if path is None else load(path)


def load(path: Path) -> ctypes.CDLL:
    """Load a build and declare its functions' signatures."""
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
    p = lib.muser_a8w8_packed_bytes
    p.restype = ctypes.c_int64
    p.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.muser_a8w8_pack.restype = None
    lib.muser_a8w8_pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    b = lib.muser_a8w8_linear
    b.restype = ctypes.c_int
    b.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                  ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    a = lib.muser_attend_visible
    a.restype = ctypes.c_int
    a.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_void_p,
                  ctypes.c_int, ctypes.c_int]
    r = lib.muser_attend_rows
    r.restype = ctypes.c_int
    r.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_void_p,
                  ctypes.c_int, ctypes.c_int]
    rs = lib.muser_attend_rows_sinks
    rs.restype = ctypes.c_int
    rs.argtypes = r.argtypes[:20] + [ctypes.c_void_p] + r.argtypes[20:]        # + sinks before out
    return lib


def available() -> bool:
    return library() is not None
