"""MUSER_DOT_CPP's host side, without a GPU (backends/cuda/cpp_dot.py): which projections the
C++ kernel takes (`route`: dot_rows' endings only, shared memory that fits), the build's cache
and failures, and the fallback -- a warning naming why, then the Triton tiles.  The kernel's
bits are tests/cuda/test_cpp_dot.py's (an sm_90 GPU)."""
import ctypes
import shutil

import pytest
import torch

from muser.backends.cuda import cpp_dot
from muser.backends.cuda.cpp_dot import GLU, PLAIN, SPLIT, build, load, route, smem_bytes

ROUTES = [  # (n, k, rows, glu, gelu, piece, defer, variant) -> (mode, ks, warps, nt) | None
    ((1536, 1152, 1, False, False, 0, False, "on"), (PLAIN, 1152, 2, 1)),
    ((1536, 1152, 16, False, False, 0, True, "41"), (PLAIN, 1152, 4, 1)),
    ((1536, 1152, 17, False, False, 0, False, "on"), None),          # more than one m16 tile
    ((6912, 1152, 1, True, True, 0, False, "on"), (GLU, 1152, 2, 1)),
    ((6912, 1152, 1, True, False, 0, False, "on"), None),            # SiLU: not in the .cu
    ((1152, 6912, 1, False, False, 1024, True, "on"), (SPLIT, 1024, 2, 1)),
    ((1152, 6912, 1, False, False, 1024, False, "on"), None),        # pieces summed: Triton's
    ((2560, 10240, 1, False, False, 0, False, "on"), (PLAIN, 10240, 1, 1)),   # 2 x 1 too big
    ((2560, 10240, 5, False, False, 0, False, "on"), None),          # nothing fits
    ((1536, 1100, 1, False, False, 0, False, "on"), None),           # K not a multiple of 64
    ((1532, 1152, 1, False, False, 0, False, "on"), None),           # n not a multiple of 8
]


@pytest.mark.parametrize("args,want", ROUTES)
def test_route_takes_only_what_the_kernel_ends_as_dot_rows_does(args, want):
    assert route(*args) == want


def test_shared_memory_counts_both_halves_of_gate_up():
    assert smem_bytes(GLU, 2, 1, 1, 1152) == 64 + (32 + 1) * (2 * 1152 + 16)
    assert smem_bytes(PLAIN, 2, 1, 1, 1152) == 64 + (16 + 1) * (2 * 1152 + 16)


def test_without_nvcc_the_build_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="no nvcc"):
        build(tmp_path, nvcc=str(tmp_path / "nvcc"))


@pytest.mark.parametrize("variant,device,why", [
    ("33", "cpu", "no CTA shape '33'"),
    ("on", "cpu", "built for sm_90 and the device is cpu"),
])
def test_load_warns_and_leaves_the_triton_tiles(tmp_path, variant, device, why):
    with pytest.warns(RuntimeWarning, match=why):
        assert load(variant, tmp_path, torch.device(device)) is None


def test_the_kernel_source_ships_with_the_package():
    assert cpp_dot.SRC.is_file() and "gemv_mma_launch" in cpp_dot.SRC.read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_builds_it_once_and_its_entry_point_refuses_bad_shapes(tmp_path):
    so = build(tmp_path)
    stamp = so.stat().st_mtime_ns
    assert build(tmp_path) == so and so.stat().st_mtime_ns == stamp     # cached by digest
    fn = ctypes.CDLL(str(so)).gemv_mma_launch
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    # refused before any CUDA call: K not a multiple of 64, 17 rows, an unknown mode / shape
    bad = [(1, 64, 100, 100, PLAIN, 2, 1), (17, 64, 64, 64, PLAIN, 2, 1),
           (1, 64, 64, 64, 7, 2, 1), (1, 64, 64, 64, PLAIN, 3, 3)]
    for B, N, K, ks, mode, warps, nt in bad:
        assert fn(None, None, None, B, N, K, ks, mode, warps, nt, 0, None) == -1


def test_plan_leaves_other_dtypes_and_unaligned_views_to_the_triton_tiles():
    kern = cpp_dot.CppDot.__new__(cpp_dot.CppDot)          # no library: plan() reads none
    kern.variant = "on"
    w = torch.zeros(128, 64, dtype=torch.bfloat16)
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    assert kern.plan(x, w, 128, False, False, 0, False) == (PLAIN, 64, 2, 1)
    assert kern.plan(x.float(), w, 128, False, False, 0, False) is None
    strided = w.t().contiguous().t()                                              # not contiguous
    assert kern.plan(x, strided, 128, False, False, 0, False) is None
    odd = torch.zeros(2 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 64)          # 2 bytes off
    assert kern.plan(odd, w, 128, False, False, 0, False) is None
