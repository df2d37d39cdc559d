"""MUSER_DOT_CPP's host side, without a GPU (backends/cuda/cpp_dot.py, cpp_route.py): which
projections the C++ kernel takes (`route`: dot_rows' endings only, shared memory that fits), the
build's cache and failures, and the fallback -- a warning naming why, then the Triton tiles.
The kernel's bits are tests/cuda/test_cpp_dot.py's (an sm_90 GPU)."""
import ctypes
import shutil

import pytest
import torch

from muser.backends.cuda import cpp_dot
from muser.backends.cuda.weights_int8 import RowInt8
from muser.backends.cuda.cpp_dot import build, load
from muser.backends.cuda.cpp_route import (GLU, PLAIN, SMEM, SPLIT, norm_bytes, norm_route,
                                           norm_shape, route, smem_bytes)

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
    assert smem_bytes(GLU, 2, 1, 1, 1152) == 128 + (32 + 1) * (2 * 1152 + 16)
    assert smem_bytes(PLAIN, 2, 1, 1, 1152) == 128 + (16 + 1) * (2 * 1152 + 16)
    # int8 rows: a byte a weight; x stays bf16
    assert smem_bytes(GLU, 2, 1, 1, 1152, 1) == 128 + 32 * (1152 + 16) + (2 * 1152 + 16)


def test_int8_rows_fit_where_bf16_rows_do_not():
    assert route(2560, 10240, 5, False, False, 0, False, "on") is None
    assert route(2560, 10240, 5, False, False, 0, False, "on", 1) == (PLAIN, 10240, 1, 1)


@pytest.mark.parametrize("k", [640, 1000, 1152, 2048, 2560, 4096])
def test_norm_shape_is_add_norms_block_and_warps(k):
    from muser.backends.cuda.triton_ops import _row_shape
    want = _row_shape(k)
    assert norm_shape(k) == (want["num_warps"], want["BLOCK"])


NORM_ROUTES = [  # (n, k, rows, glu, gelu, piece, pieces, variant, layernorm) -> plan | None
    ((1536, 1152, 1, False, False, 0, 7, "norm", False), (PLAIN, 1152, 2, 1)),  # 1B qkv
    ((6912, 1152, 16, True, True, 0, 0, "norm", False), (GLU, 1152, 2, 1)),     # 1B gate|up
    ((1536, 640, 1, False, False, 0, 0, "norm", False), (PLAIN, 640, 2, 1)),    # 270M qkv
    ((10240, 2560, 16, True, True, 0, 0, "norm", False), None),  # 4B gate|up x 16: no room
    ((10240, 2560, 1, True, True, 0, 0, "norm", False), (GLU, 2560, 2, 1)),
    ((1536, 1152, 16, False, False, 0, 7, "norm", False), None),  # 7 pieces x 16 rows: 516 KB
    ((1536, 1152, 1, False, False, 0, 0, "norm", True), None),    # LayerNorm: another tree
    ((1536, 1152, 1, False, False, 256, 0, "norm", False), None),  # a split tile sums pieces
    ((1024, 512, 1, False, False, 0, 0, "norm", False), None),    # BLOCK 512: < 8 keys a thread
    ((1536, 1152, 17, False, False, 0, 0, "norm", False), None),  # more than 16 rows
]


def test_norm_route_counts_the_staged_inputs_in_shared_memory():
    assert norm_bytes(1, 1152, 7) == 8 * 1152 + 2 * 1152 + 4 * 7 * 1152
    assert norm_bytes(16, 1152, 0) == 8 * 1152 + 2 * 2 * 16 * 1152
    mode, ks, warps, nt = norm_route(6912, 1152, 16, True, True, 0, 0, "norm", False)
    assert smem_bytes(mode, warps, nt, 16, ks) + norm_bytes(16, 1152, 0) <= SMEM


@pytest.mark.parametrize("args,want", NORM_ROUTES)
def test_norm_route_takes_only_whole_projections_of_add_norms_layout(args, want):
    assert norm_route(*args) == want


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
    included = [cpp_dot.SRC.read_text()]
    for header in ("gemv_kernel.cuh", "sm90.cuh", "triton_math.cuh"):   # and in the digest
        assert any(f'#include "{header}"' in text for text in included)
        included.append((cpp_dot.CSRC / header).read_text())


def test_an_edit_to_a_header_changes_the_digest(tmp_path, monkeypatch):
    for f in cpp_dot.CSRC.glob("*.cu*"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(cpp_dot, "CSRC", tmp_path)
    before = cpp_dot.digest()
    (tmp_path / "triton_math.cuh").write_text((tmp_path / "triton_math.cuh").read_text() + "\n")
    assert cpp_dot.digest() != before


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_builds_it_once_and_its_entry_point_refuses_bad_shapes(tmp_path):
    so = build(tmp_path)
    stamp = so.stat().st_mtime_ns
    assert build(tmp_path) == so and so.stat().st_mtime_ns == stamp     # cached by digest
    fn = ctypes.CDLL(str(so)).gemv_mma_launch
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    # refused before any CUDA call: K not a multiple of 64, 17 rows, an unknown mode / shape,
    # pieces that a rounded or GLU ending would leave unsummed
    bad = [(1, 64, 100, 100, PLAIN, 2, 1), (17, 64, 64, 64, PLAIN, 2, 1),
           (1, 64, 64, 64, 7, 2, 1), (1, 64, 64, 64, PLAIN, 3, 3),
           (1, 64, 128, 64, PLAIN, 2, 1), (1, 64, 128, 64, GLU, 2, 1)]
    for B, N, K, ks, mode, warps, nt in bad:
        assert fn(None, None, None, None, B, N, K, ks, mode, warps, nt, 0, None) == -1
    norm = ctypes.CDLL(str(so)).gemv_norm_launch
    norm.restype = ctypes.c_int
    norm.argtypes = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 4 +
                     [ctypes.c_float] + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 3 +
                     [ctypes.c_int] * 7 + [ctypes.c_void_p])
    # (tw, block, K, mode): pieces out; a tree add_norm does not have -- 3 warps, BLOCK not a
    # power of two, BLOCK < K, fewer than 8 keys a Triton thread
    for tw, block, K, mode in [(4, 2048, 1152, SPLIT), (3, 2048, 1152, PLAIN),
                               (4, 1536, 1152, PLAIN), (4, 1024, 1152, PLAIN),
                               (4, 512, 512, PLAIN), (8, 1024, 1024, PLAIN)]:
        assert norm(None, None, 0, None, None, None, None, 1e-6, tw, block, None, None, None, 1,
                    64, K, mode, 2, 1, 0, None) == -1


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
    rows = RowInt8(torch.zeros(128, 64, dtype=torch.int8), torch.ones(128))       # quant="int8"
    assert kern.plan(x, rows, 128, False, False, 0, False) == (PLAIN, 64, 2, 1)
    assert kern.plan(x, RowInt8(rows.q, rows.scale.half()), 128, False, False, 0, False) is None
    assert kern.plan(x, w.half(), 128, False, False, 0, False) is None
