"""Chunk tiles for `dot_rows` (CUDA): which give each row the decode tile's bits, and how fast.

For each projection shape of the Gemma-3-1B / -4B decode tables: x [300, K] through the decode
tiles (rows=16) is the reference; each candidate chunk tile (block_m, block_n, block_k, warps,
stages) must give torch.equal rows.  Then 16,384 rows are timed (CUDA events, weights past
the L2 in between not needed: a chunk is compute-bound) against cuBLAS (x @ w.T; gate|up as
one [2I, K] product, its act*mul not counted) and the current default tile.

    PYTHONPATH=. python3 benchmarks/dot_chunk_sweep.py [--rows 16384]
"""
import argparse

import torch

from cuda_measure import timed
from muser.backends.cuda.triton_dot import dot_rows
from muser.backends.cuda.triton_dot_tiles import DOT_TILES, chunk_tile, dot_config

CANDIDATES = [(64, 128, 64, 4, 4), (128, 64, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4),
              (128, 256, 64, 8, 3), (128, 128, 32, 8, 4), (256, 128, 64, 8, 3), (128, 128, 128, 8, 2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    for (n, k, glu) in list(DOT_TILES) + [(262144, 1152, False)]:
        w = (torch.randn(2 * n if glu else n, k, device=dev) / k ** 0.5).to(dt)
        x = torch.randn(300, k, device=dev).to(dt)
        ref = torch.cat([dot_rows(x[i:i + 16], w, glu=glu, rows=16) for i in range(0, 300, 16)])
        xb = torch.randn(args.rows, k, device=dev).to(dt)
        flops = 2 * args.rows * w.shape[0] * k
        t_cublas = timed(lambda: xb @ w.T)
        line = [f"({n},{k},{'glu' if glu else '-'}) cuBLAS {t_cublas:.3f} ms {flops / t_cublas / 1e9:.0f} TF/s"]
        default = chunk_tile(args.rows, glu, dot_config(n, k, glu)[4])
        for cand in [None] + CANDIDATES:
            if glu and cand and cand[1] >= 256:
                continue
            try:
                got = dot_rows(x, w, glu=glu, tile=cand or default)
                eq = torch.equal(got, ref)
                t = timed(lambda: dot_rows(xb, w, glu=glu, tile=cand or default))
                line.append(f"  {cand or 'default'}: equal={eq} {t:.3f} ms {flops / t / 1e9:.0f} TF/s "
                            f"({t / t_cublas:.2f}x cuBLAS)")
            except Exception as e:                                    # noqa: BLE001
                line.append(f"  {cand}: FAILED {type(e).__name__}: {str(e)[:120]}")
        print("\n".join(line), flush=True)


if __name__ == "__main__":
    main()
