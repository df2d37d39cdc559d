"""Batch-invariant projection kernels on CUDA, per decode shape: `gemv` (tile loaded once, a loop
over rows) vs `dot_rows` (rows in tiles of 16 on the tensor cores) at several tilings, B=1 and 16,
against cuBLAS (batch-variant).  Microseconds, median of `triton.testing.do_bench`.

    PYTHONPATH=. python3 benchmarks/cuda_gemv_sweep.py
"""
import itertools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from muser.backends.cuda.triton_dot import dot_rows
from muser.backends.cuda.triton_gemv import gemv

SHAPES = [(1536, 1152, False), (1152, 1024, False), (6912, 1152, True), (1152, 6912, False),
          (262144, 1152, False), (4096, 2560, False), (10240, 2560, True), (2560, 10240, False)]


def us(fn):
    return do_bench(fn, warmup=20, rep=60, return_mode="median") * 1e3


def main():
    dev = "cuda"
    for n, k, glu in SHAPES:
        w = (torch.randn((2 * n if glu else n), k, device=dev) / k ** 0.5).to(torch.bfloat16)
        line = [f"{n}x{k}{' glu' if glu else ''}"]
        for B in (1, 16):
            x = torch.randn(B, k, device=dev).to(torch.bfloat16)
            cub = us(lambda: F.linear(x, w))
            gv = us(lambda: gemv(x, w, glu=glu))
            best = None
            dflt = us(lambda: dot_rows(x, w, glu=glu))
            for bn, bk, st, pc in itertools.product((16, 32, 64), (128, 256, 512), (3, 4),
                                                    (0, 1024, 2048) if k >= 4096 else (0,)):
                if pc and pc % bk:
                    continue
                try:
                    t = us(lambda: dot_rows(x, w, glu=glu, config=(bn, bk, 4, st, pc)))
                except Exception:
                    continue
                if best is None or t < best[0]:
                    best = (t, bn, bk, st, pc)
            line.append(f"B{B}: cublas {cub:.1f} gemv {gv:.1f} dot(table) {dflt:.1f} "
                        f"best {best[0]:.1f} {best[1:]}")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
