"""Do TMA loads make `dot_rows`' chunk tiles faster, with the same bits?  (issue 12, 16k prefill)

`dot_rows`' 128-row chunk tiles load X and W with masked pointer loads (cp.async); at 16k rows
they are 0.97-1.75x cuBLAS (gate|up 1.42x, the down projection with its split-K pieces 1.75x:
benchmarks/NOTES.md, seventh and eleventh sessions).  The K step and the tile are not the
arithmetic (each tl.dot chains its k16 MMA steps onto its accumulator), so a kernel that loads
the same tiles through tensor descriptors (TMA: one bulk copy a tile, out-of-range rows and
keys filled with zeros -- the masked loads' `other=0`), walks the same split-K pieces from zero
and sums them in order, and ends in the same epilogue (`_act_up`), should give every row the
decode tile's bits.  This probe checks that (torch.equal against 16-row decode tiles) and times
16,384 rows against cuBLAS and the default chunk tile, on the 1B's and 270M's projections;
GROUP_M orders the programs so that GROUP_M row tiles share each weight tile in the L2.

    PYTHONPATH=.:benchmarks python3 benchmarks/tma_dot_probe.py [--rows 16384]
"""
import argparse
import functools

import torch

from cuda_measure import timed
from muser.backends.cuda.triton_dot import act_pieces, dot_rows
from muser.backends.cuda.triton_dot_tiles import chunk_tile, dot_config

SHAPES = [(1536, 1152, False), (1152, 1024, False), (6912, 1152, True), (1152, 6912, False),
          (1536, 640, False), (640, 1024, False), (2048, 640, True), (640, 2048, False)]
# (block_m, block_n, block_k, warps, stages, group_m)
CANDIDATES = [(128, 128, 64, 8, 3, 1), (128, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8),
              (128, 256, 64, 8, 3, 8), (128, 64, 64, 8, 4, 8), (128, 128, 64, 4, 4, 8),
              (128, 256, 64, 8, 4, 8)]


@functools.lru_cache(maxsize=None)
def kernel():
    import triton
    import triton.language as tl
    globals()["tl"] = tl
    globals().update(act_pieces())

    @triton.jit
    def tma_dot(xd, wd, Y, B, N, KS: tl.constexpr, PIECES: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr,
                GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        num_m = tl.cdiv(B, BM)
        num_n = tl.cdiv(N, BN)
        per_group = GROUP_M * num_n
        first_m = (pid // per_group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        pm = first_m + (pid % per_group) % size_m
        pn = (pid % per_group) // size_m
        om, on = pm * BM, pn * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        accu = tl.zeros((BM, BN), dtype=tl.float32)
        for pc in range(PIECES):
            pa = tl.zeros((BM, BN), dtype=tl.float32)
            pu = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, KS, BK):
                k = pc * KS + k0
                x = xd.load([om, k])
                pa = tl.dot(x, tl.trans(wd.load([on, k])), pa)
                if GLU:
                    pu = tl.dot(x, tl.trans(wd.load([N + on, k])), pu)
            acc += pa
            if GLU:
                accu += pu
        if GLU:
            acc = _act_up(acc, accu, Y.dtype.element_ty, GELU)   # noqa: F821
        rows = om + tl.arange(0, BM)
        cols = on + tl.arange(0, BN)
        tl.store(Y + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(Y.dtype.element_ty),
                 mask=(rows < B)[:, None] & (cols < N)[None, :])

    return tma_dot


def tma_rows(x, w, glu, cand):
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk, nw, st, gm = cand
    n, k = w.shape
    n //= 2 if glu else 1
    piece = dot_config(n, k, glu)[4]
    ks, pieces = (piece, triton.cdiv(k, piece)) if piece else (triton.cdiv(k, bk) * bk, 1)
    if ks % bk:
        raise ValueError(f"piece {ks} not a multiple of the K step {bk}")
    B = x.shape[0]
    y = x.new_empty(B, n)
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    grid = (triton.cdiv(B, bm) * triton.cdiv(n, bn),)
    kernel()[grid](xd, wd, y, B, n, KS=ks, PIECES=pieces, BM=bm, BN=bn, BK=bk, GLU=glu,
                   GELU=True, GROUP_M=gm, num_warps=nw, num_stages=st)
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    args = ap.parse_args()
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
        eq_def = torch.equal(dot_rows(x, w, glu=glu, gelu=True,
                                      tile=chunk_tile(args.rows, dot_config(n, k, glu)[1], glu)), ref)
        line = [f"({n},{k},{'glu' if glu else '-'}) cuBLAS {t_cublas:.3f} ms "
                f"{flops / t_cublas / 1e9:.0f} TF/s; default tile {t_def:.3f} ms "
                f"({t_def / t_cublas:.2f}x cuBLAS) equal={eq_def}"]
        for cand in CANDIDATES:
            if glu and cand[1] >= 256:
                continue
            try:
                eq = torch.equal(tma_rows(x, w, glu, cand), ref)
                t = timed(lambda: tma_rows(xb, w, glu, cand))
                line.append(f"  tma {cand}: equal={eq} {t:.3f} ms {flops / t / 1e9:.0f} TF/s "
                            f"({t / t_cublas:.2f}x cuBLAS, {t / t_def:.2f}x default)")
            except Exception as e:                                    # noqa: BLE001
                line.append(f"  tma {cand}: FAILED {type(e).__name__}: {str(e)[:200]}")
        print("\n".join(line), flush=True)


if __name__ == "__main__":
    main()
