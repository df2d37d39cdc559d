"""The CPU default path's kernels against what they replaced (issue 12, "one arithmetic per token").

    python benchmarks/cpu_rows_kernels.py                   # both sections
    python benchmarks/cpu_rows_kernels.py --sections linear
    sh -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 python benchmarks/cpu_rows_kernels.py'

linear:    the projections of Gemma 3 270M (q|k|v 1536x640, gate|up 4096x640, o 640x1024,
           down 640x2048) at M = 1 / 16 / 512 rows: `native.BoundA8W8` (csrc/a8w8.c, every row
           count) vs `native.BoundQ8` (the f32-activation GEMV the projections ran at M <= 64) vs
           oneDNN bf16 `F.linear` (the dense copy prefill chunks ran).  Weights are cycled through
           copies totalling >= 128 MB so every call streams them from DRAM, as a decode step does.
attention: `native.attend_rows` (csrc/attend.c: the chunk, verification and decode path) vs
           `F.scaled_dot_product_attention` with the window mask (what > 64-row chunks ran) for
           prefill chunks, and vs the same kernel's decode step; GMAC/s counts q.k and p.v over the
           visible keys only.
Each cell: min over repeats of the mean time per call (the box is shared: min is the guide).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from muser.attention.reference import visibility_mask
from muser.model import native
from muser.model.quant import quantize_rowwise_int8

SHAPES = [(1536, 640), (4096, 640), (640, 1024), (640, 2048)]


def _time(fn, calls: int, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def linear() -> None:
    print("| N x K | M | a8w8 (us) | f32-act int8 GEMV (us) | oneDNN bf16 (us) | a8w8 int8 GMAC/s |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        copies = max(1, min(64, int(128e6 // (n * k))))
        qs = [quantize_rowwise_int8(torch.randn(n, k, generator=g)) for _ in range(copies)]
        a8 = [native.BoundA8W8(q.qweight, q.scale) for q in qs]
        q8 = [native.BoundQ8(q.qweight, q.scale) for q in qs]
        dense = [q.qweight.bfloat16() for q in qs[:8]]
        for m in (1, 16, 512):
            x = torch.randn(m, k, generator=g).bfloat16()
            calls = copies if m < 512 else 8
            ta = _time(lambda i=0: a8[i % copies](x, torch.bfloat16), calls)
            tq = _time(lambda i=0: q8[i % copies](x, torch.bfloat16), calls) if m <= 16 else float("nan")
            td = _time(lambda i=0: F.linear(x, dense[i % len(dense)]), calls) if m > 1 else float("nan")
            gmac = 2 * m * n * k / ta / 1e9                  # two int8 planes per activation row
            print(f"| {n}x{k} | {m} | {ta * 1e6:.1f} | {tq * 1e6:.1f} | {td * 1e6:.1f} | {gmac:.0f} |", flush=True)


def attention() -> None:
    print("| rows x keys (window) | attend_rows (ms) | GMAC/s | SDPA + mask (ms) | GMAC/s |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(1)
    h, d = 4, 256
    for t, start, window in [(512, 0, None), (512, 512, 512), (512, 1536, None), (512, 1536, 512),
                             (16, 2032, None), (1, 511, None), (1, 2047, None), (1, 2047, 512), (1, 32767, None)]:
        s = start + t
        k = torch.randn(s, 1, d, generator=g).bfloat16()
        v = torch.randn(s, 1, d, generator=g).bfloat16()
        q = torch.randn(t, h, d, generator=g).bfloat16()
        pairs = sum(min(p + 1, window or p + 1) for p in range(start, s))
        macs = pairs * h * d * 2
        calls = 1000 if t == 1 else 4
        tn = _time(lambda i=0: native.attend_rows(q, k, v, start, window, 0, 0.0625), calls)
        lo = max(0, start - (window or s) + 1)
        ks, vs = k[lo:].transpose(0, 1)[None], v[lo:].transpose(0, 1)[None]
        mask = visibility_mask(torch.arange(start, s), torch.arange(lo, s), window)
        qs = q.transpose(0, 1)[None]
        ts = _time(lambda i=0: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=0.0625,
                                                               enable_gqa=True), calls)
        print(f"| {t} x {s} ({window or 'full'}) | {tn * 1e3:.3f} | {macs / tn / 1e9:.0f} | {ts * 1e3:.3f} | "
              f"{macs / ts / 1e9:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="linear,attention")
    args = ap.parse_args()
    if not native.available():
        raise SystemExit("the native kernels are not built (no C compiler, or MUSER_NATIVE=0)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.sections.split(","):
        print(f"\n## {name}\n")
        {"linear": linear, "attention": attention}[name]()


if __name__ == "__main__":
    main()
