"""Speculative rollback cost vs context length on the embedded model's cache geometry.

Geometry of Gemma 3 270M: 15 ring planes (W = 512) + 3 growing planes, 1 KV head x 256,
float32 rows.  For each context N: fill the planes to N, then time many rounds of
checkpoint -> (store a block, untimed) -> rollback(keep=0).  keep=0 is the worst case:
every row the block evicted from a ring is restored.  The claim under test: growing
planes rewind three integers and ring planes restore <= block rows, so the cost does
not depend on N.

    python benchmarks/rollback_cost.py --contexts 2048 8192 32768 --rounds 300
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from muser.cache import Checkpoint, build_planes
from muser.config import LayerSpec


def planes_at(n: int, max_context: int):
    layers = tuple(LayerSpec(i, "full" if (i + 1) % 6 == 0 else "sliding",
                             None if (i + 1) % 6 == 0 else 512, True) for i in range(18))
    planes = build_planes(layers, "ring", max_context, 1, 256, torch.float32, "cpu")
    for p in planes:
        for s in range(0, n, 4096):
            c = min(4096, n - s)
            p.store(s, torch.randn(c, 1, 256), torch.randn(c, 1, 256))
    return planes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--block", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    bk, bv = torch.randn(args.block, 1, 256), torch.randn(args.block, 1, 256)
    rows = []
    for n in args.contexts:
        planes = planes_at(n, max(args.contexts) + args.block)
        times, retained = [], 0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            cp = Checkpoint(planes, n, args.block)
            t_open = time.perf_counter() - t0
            for p in planes:
                p.store(n, bk, bv)
            retained = max(retained, max(cp.retained_bytes()))
            t1 = time.perf_counter()
            cp.rollback(0)
            times.append(t_open + time.perf_counter() - t1)
        med = statistics.median(times) * 1e6
        rows.append((n, med, retained))
        print(f"context {n:6d}: checkpoint + rollback median {med:7.1f} us; most retained by a plane "
              f"{retained} B (block x row bytes = {args.block * 2 * 256 * 4} B)", flush=True)
    base = rows[0][1]
    print("\n| context | checkpoint + rollback, median (us) | vs first | max retained per plane (B) |")
    print("|---|---|---|---|")
    for n, med, ret in rows:
        print(f"| {n:,} | {med:.1f} | {med / base:.2f}x | {ret:,} |")


if __name__ == "__main__":
    main()
