"""Do TMA loads make `dot_rows`' chunk tiles faster, with the same bits?  (issue 12, 16k prefill)

`dot_rows`' 128-row chunk tiles load X and W with masked pointer loads (cp.async); at 16k rows
they are 0.97-1.75x cuBLAS (gate|up 1.42x, the down projection with its split-K pieces 1.75x:
benchmarks/NOTES.md, seventh and eleventh sessions).  `triton_dot_tma.dot_tma` loads the same
tiles through tensor descriptors (TMA), walks the same split-K pieces and ends in the same
epilogue, so every row should keep the decode tile's bits.  This probe checks that (torch.equal
against 16-row decode tiles, 300 rows) and times 16,384 rows against cuBLAS and the default
chunk tile, on the 1B's and 270M's projections, for a few tiles and program orders (group_m:
row tiles that share a sweep of weight tiles in the L2).

    PYTHONPATH=.:benchmarks python3 benchmarks/tma_dot_probe.py [--rows 16384]

`--host`: the host's cost of a launch instead -- microseconds of CPU a call, pointer tiles
against TMA tiles, at 256 rows (the GPU queue ahead, so the loop measures the host alone), and
the pieces of a TMA launch alone (a TensorDescriptor built, one descriptor encoded).
"""
import argparse
import time

import torch

from cuda_measure import timed
from muser.backends.cuda.triton_dot import dot_rows
from muser.backends.cuda.triton_dot_tiles import chunk_tile, dot_config, tma_tile
from muser.backends.cuda.triton_dot_tma import _kernel, dot_tma

SHAPES = [(1536, 1152, False), (1152, 1024, False), (6912, 1152, True), (1152, 6912, False),
          (1536, 640, False), (640, 1024, False), (2048, 640, True), (640, 2048, False)]
# (block_m, block_n, block_k, warps, stages), group_m
CANDIDATES = [((128, 128, 64, 8, 3), 1), ((128, 128, 64, 8, 3), 8), ((128, 128, 64, 8, 4), 8),
              ((128, 256, 64, 8, 3), 8), ((128, 64, 64, 8, 4), 8), ((128, 128, 64, 4, 4), 8),
              ((128, 256, 64, 8, 4), 8),
              # 64-row tiles (one warpgroup): for 512- and 2,048-row chunks, where 128-row tiles
              # leave multiprocessors idle (the 1B's down projection at 2,048 rows: 80 programs)
              ((64, 128, 64, 4, 4), 8), ((64, 256, 64, 4, 3), 8), ((64, 64, 64, 4, 4), 8),
              ((64, 128, 64, 4, 3), 1)]


def tma_rows(x, w, glu, tile, group):
    n, k = w.shape
    n //= 2 if glu else 1
    piece = dot_config(n, k, glu)[4]
    bk = tile[2]
    ks, pieces = (piece, -(-k // piece)) if piece else (-(-k // bk) * bk, 1)
    return dot_tma(x, w, x.new_empty(x.shape[0], n), n, glu, True, None, tile, ks, pieces,
                   False, group)


def host_us(fn, reps=400):
    """CPU microseconds a call of `fn` (launches only: the GPU is not waited for)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / reps * 1e6


def host(rows):
    """The host's cost of a dot_rows launch, pointer tiles against TMA tiles, and of the pieces
    of a TMA launch."""
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor
    dev, dt = "cuda", torch.bfloat16
    for (n, k, glu) in SHAPES:
        w = (torch.randn(2 * n if glu else n, k, device=dev) / k ** 0.5).to(dt)
        x = torch.randn(rows, k, device=dev).to(dt)
        tile = chunk_tile(1 << 14, glu, dot_config(n, k, glu)[4])
        ptr = host_us(lambda: dot_rows(x, w, glu=glu, tile=tile))
        tma = host_us(lambda: dot_rows(x, w, glu=glu, tile=tile, tma=True))
        desc = host_us(lambda: TensorDescriptor(x, list(x.shape), list(x.stride()), [128, 64]))
        fill = triton.runtime.driver.active.utils.fill_tma_descriptor
        try:                                            # swizzle 128B, bf16 (host enum 9)
            enc = host_us(lambda: fill(x.data_ptr(), 3, 2, 9, [128, 64], list(x.shape),
                                       list(x.stride()), 0))
        except Exception:                                                # noqa: BLE001
            enc = float("nan")
        # the launch alone, its two descriptors built once (what a descriptor cache would save)
        bm, bn, bk, nw, st = tma_tile(n, k, glu) or (128, 128, 64, 8, 3)
        xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
        wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
        out = x.new_empty(rows, n)
        grid = (triton.cdiv(rows, bm) * triton.cdiv(n, bn),)
        ks = -(-k // bk) * bk
        kern = _kernel()
        cached = host_us(lambda: kern[grid](xd, wd, w, out, rows, n, KS=ks, PIECES=1, BM=bm,
                                            BN=bn, BK=bk, GLU=glu, GELU=True, HAS_BIAS=False,
                                            GROUP=8, PDL=False, num_warps=nw, num_stages=st))
        print(f"({n},{k},{'glu' if glu else '-'}) {rows} rows, host us a call: pointer tiles "
              f"{ptr:.1f}, TMA tiles {tma:.1f} (+{tma - ptr:.1f}); TMA launch with its "
              f"descriptors built once {cached:.1f}; TensorDescriptor() {desc:.1f}, one "
              f"descriptor encoded {enc:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--host", action="store_true", help="the host's cost of a launch instead")
    args = ap.parse_args()
    if args.host:
        return host(args.rows)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    for (n, k, glu) in SHAPES:
        w = (torch.randn(2 * n if glu else n, k, device=dev) / k ** 0.5).to(dt)
        x = torch.randn(300, k, device=dev).to(dt)
        ref = torch.cat([dot_rows(x[i:i + 16], w, glu=glu, gelu=True, rows=16)
                         for i in range(0, 300, 16)])
        xb = torch.randn(args.rows, k, device=dev).to(dt)
        flops = 2 * args.rows * w.shape[0] * k
        t_cublas = timed(lambda: xb @ w.T)
        t_def = timed(lambda: dot_rows(xb, w, glu=glu, gelu=True))
        tile = chunk_tile(args.rows, glu, dot_config(n, k, glu)[4])
        line = [f"({n},{k},{'glu' if glu else '-'}) cuBLAS {t_cublas:.3f} ms "
                f"{flops / t_cublas / 1e9:.0f} TF/s; default tile {tile} {t_def:.3f} ms "
                f"({t_def / t_cublas:.2f}x cuBLAS) equal={torch.equal(dot_rows(x, w, glu=glu, gelu=True, tile=tile), ref)}"]
        for cand, group in [(tile, 8)] + CANDIDATES:
            if glu and cand[1] >= 256:
                continue
            try:
                eq = torch.equal(tma_rows(x, w, glu, cand, group), ref)
                t = timed(lambda: tma_rows(xb, w, glu, cand, group))
                line.append(f"  tma {cand} group {group}: equal={eq} {t:.3f} ms "
                            f"{flops / t / 1e9:.0f} TF/s ({t / t_cublas:.2f}x cuBLAS, "
                            f"{t / t_def:.2f}x default)")
            except Exception as e:                                    # noqa: BLE001
                line.append(f"  tma {cand} group {group}: FAILED {type(e).__name__}: {str(e)[:200]}")
        print("\n".join(line), flush=True)


if __name__ == "__main__":
    main()
