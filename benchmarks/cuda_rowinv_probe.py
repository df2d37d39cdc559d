"""Probe for the "one arithmetic per token" issue on CUDA: can a prefill chunk's GEMM use big
row tiles and still give each row the bits the decode step's 16-row tiles give?

For bf16 x [M, K] @ w [N, K].T with K walked in the same BLOCK_K steps, one Triton kernel is
compiled with BLOCK_M in {16, 32, 64, 128} (the instruction the compiler picks changes: mma.sync
at 16 rows, wgmma from 64); every variant's rows are compared with torch.equal against the
16-row variant and against `triton_dot.dot_rows` (the decode step's kernel), and timed against
cuBLAS (F.linear).  Prints one line per (shape, BLOCK_M): equal?, max |diff|, ms, TFLOP/s.

    PYTHONPATH=. python3 benchmarks/cuda_rowinv_probe.py
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from cuda_measure import timed


@triton.jit
def mm(X, W, Y, M, N, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
       BLOCK_K: tl.constexpr):
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + rm[:, None].to(tl.int64) * K + ks[None, :], mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(W + cols[:, None].to(tl.int64) * K + ks[None, :], mask=(cols[:, None] < N) & (ks[None, :] < K), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    tl.store(Y + rm[:, None].to(tl.int64) * N + cols[None, :], acc.to(Y.dtype.element_ty),
             mask=(rm[:, None] < M) & (cols[None, :] < N))


def run(x, w, bm, bn, bk, warps, stages):
    M, K = x.shape
    N = w.shape[0]
    y = x.new_empty(M, N)
    mm[(triton.cdiv(N, bn), triton.cdiv(M, bm))](x, w, y, M, N, K=K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                  num_warps=warps, num_stages=stages)
    return y


def main():
    from muser.backends.cuda.triton_dot import dot_rows
    torch.manual_seed(0)
    for (M, N, K) in [(2048, 6912, 1152), (2048, 1152, 6912), (4096, 2560, 2560), (512, 1536, 1152)]:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
        base = run(x, w, 16, 64, 64, 4, 3)
        dec = dot_rows(x[:17], w, config=(64, 64, 4, 3, 0))
        print(f"[{M}x{N}x{K}] dot_rows(block_k 64) rows == 16-row mm: {torch.equal(dec, base[:17])}; "
              f"cuBLAS == 16-row mm: {torch.equal(torch.nn.functional.linear(x, w), base)}")
        flops = 2 * M * N * K
        ms = timed(lambda: torch.nn.functional.linear(x, w))
        print(f"  cuBLAS {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s")
        for bm, bn, warps, stages in [(16, 64, 4, 3), (32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3),
                                      (128, 128, 8, 3), (128, 256, 8, 3)]:
            try:
                y = run(x, w, bm, bn, 64, warps, stages)
                eq = torch.equal(y, base)
                diff = float((y.float() - base.float()).abs().max())
                ms = timed(lambda: run(x, w, bm, bn, 64, warps, stages))
                print(f"  BLOCK_M {bm:3d} BLOCK_N {bn:3d} warps {warps}: rows == 16-row: {eq} "
                      f"(max |d| {diff:.3g}) {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s")
            except Exception as e:           # noqa: BLE001 -- a probe: print and go on
                print(f"  BLOCK_M {bm} BLOCK_N {bn}: failed {type(e).__name__}: {str(e)[:120]}")


if __name__ == "__main__":
    main()
