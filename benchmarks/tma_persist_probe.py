"""Where do the 16k prefill's TMA projections lose to cuBLAS?  (issue 12, the 16k rule)

At 16,384 rows `triton_dot_tma.dot_tma` runs the 1B's gate|up in 0.82 ms against cuBLAS's 0.68
and its down projection (7 split-K pieces of 1,024 keys) in 0.42 against 0.32 (twenty-first
session): ~6 ms of the 1B's ~68 ms 16k prefill -- most of issue 12's remaining gap.  Two
suspects, both speed only (the arithmetic is each piece from zero, its k16 MMA steps in order,
the pieces summed in order onto a zero start -- kept by every variant here):

- **The pieces' loop nest.**  `for piece: for k-step:` pipelines the inner loop only, so each
  of the 7 pieces drains and refills the TMA pipeline.  ONE: one loop over every k-step of every
  piece, the piece's sum folded into the total inside it (a uniform branch).
- **One program a tile at one CTA a multiprocessor.**  A 128 x 128 GLU tile holds two [128, 128]
  float32 states and 4 stages of 48 KB: one CTA a multiprocessor, so a tile's prologue and
  epilogue run with nothing beside them.  PERSIST: one program a multiprocessor walking tiles
  (grid = the SM count), Triton's flatten fusing the tile and k loops so the next tile's loads
  start under this tile's epilogue (ONE required: one inner loop).  TSTORE: the output through a
  TMA store (async, frees the epilogue's registers sooner).
- **No producer warps.**  Every warp both issues the TMA loads and runs the MMAs; cuBLAS's sm90
  kernels give the loads a warpgroup of their own.  WS (fifth digit): the one loop as
  `tl.range(..., warp_specialize=True)` -- Triton 3.6 runs Meta's Hopper auto warp
  specialization pass (`add_hopper_warpspec`) on such loops (ONE required).  Never measured here.

Every variant's rows are checked `torch.equal` against 16-row decode tiles (`dot_rows`) first,
then timed at 16,384 rows against cuBLAS and `dot_tma` (CUDA events).

    PYTHONPATH=.:benchmarks python3 benchmarks/tma_persist_probe.py [--rows 16384] [--models 1b,270m]
        [--glu both|glu|plain] [--variants 0000,1100] [--tiles 128.128.64.8.4,...]
"""
import argparse
import functools

import torch

from cuda_measure import timed
from muser.backends.cuda.triton_dot import dot_rows
from muser.backends.cuda.triton_dot_tiles import dot_config, tma_tile
from muser.backends.cuda.triton_dot_tma import dot_tma

SHAPES = {"1b": [(6912, 1152, True), (1152, 6912, False), (1536, 1152, False), (1152, 1024, False)],
          "270m": [(2048, 640, True), (640, 2048, False), (1536, 640, False), (640, 1024, False)],
          "4b": [(10240, 2560, True), (2560, 10240, False)]}
# (PERSIST, ONE, TSTORE, FLAT, WS)
VARIANTS = [(False, False, False, False, False), (False, True, False, False, False),
            (False, True, True, False, False), (True, True, True, True, False),
            (True, True, False, False, False), (False, True, False, False, True)]
TILES = [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 64, 64, 8, 4)]


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    from muser.backends.cuda.triton_dot_epilogue import act_pieces
    globals()["tl"] = tl
    pieces = act_pieces()
    globals().update(pieces)            # Triton resolves a kernel's callees in module globals
    global _finish                              # named, so a reader (and the name check) sees it
    _finish = pieces["_finish"]

    @triton.jit
    def tile_of(t, B, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
        num_m = tl.cdiv(B, BM)
        per_group = GROUP * tl.cdiv(N, BN)
        first_m = (t // per_group) * GROUP
        size_m = min(num_m - first_m, GROUP)
        return (first_m + (t % per_group) % size_m) * BM, ((t % per_group) // size_m) * BN

    globals()["tile_of"] = tile_of

    @triton.jit
    def kern(xd, wd, yd, Y, B, N, KS: tl.constexpr, PIECES: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, BK: tl.constexpr, GLU: tl.constexpr, GELU: tl.constexpr,
             GROUP: tl.constexpr, PERSIST: tl.constexpr, ONE: tl.constexpr,
             TSTORE: tl.constexpr, FLAT: tl.constexpr, NPROG: tl.constexpr,
             WS: tl.constexpr = False):
        STEPS: tl.constexpr = KS // BK
        tiles = tl.cdiv(B, BM) * tl.cdiv(N, BN)
        if PERSIST:
            first = tl.program_id(0)
            stride = NPROG
        else:
            first = tl.program_id(0)
            stride = tiles
        for t in tl.range(first, tiles, stride, flatten=FLAT):
            om, on = tile_of(t, B, N, BM, BN, GROUP)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            accu = tl.zeros((BM, BN), dtype=tl.float32)
            pa = tl.zeros((BM, BN), dtype=tl.float32)
            pu = tl.zeros((BM, BN), dtype=tl.float32)
            if ONE:
                # one loop over every piece's k-steps: the piece's sum joins the total at its
                # last step (the same adds, in the same order, as the nest below)
                for i in tl.range(PIECES * STEPS, warp_specialize=WS):
                    k = (i // STEPS) * KS + (i % STEPS) * BK
                    x = xd.load([om, k])
                    pa = tl.dot(x, tl.trans(wd.load([on, k])), pa)
                    if GLU:
                        pu = tl.dot(x, tl.trans(wd.load([N + on, k])), pu)
                    if PIECES > 1:
                        if i % STEPS == STEPS - 1:
                            acc += pa
                            pa = tl.zeros((BM, BN), dtype=tl.float32)
                            if GLU:
                                accu += pu
                                pu = tl.zeros((BM, BN), dtype=tl.float32)
                if PIECES == 1:                 # one piece: the fold after the loop (2 states)
                    acc += pa
                    if GLU:
                        accu += pu
            else:
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
            y = _finish(acc, accu, 1.0, 1.0, 0.0, False, False, GLU, GELU,  # noqa: F821
                        Y.dtype.element_ty).to(Y.dtype.element_ty)
            if TSTORE:
                yd.store([om, on], y)
            else:
                rows = om + tl.arange(0, BM)
                cols = on + tl.arange(0, BN)
                tl.store(Y + rows[:, None].to(tl.int64) * N + cols[None, :], y,
                         mask=(rows < B)[:, None] & (cols < N)[None, :])

    return kern


def run(x, w, n, glu, tile, variant, group=8):
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor
    persist, one, tstore, flat, ws = variant
    bm, bn, bk, nw, st = tile
    k = w.shape[1]
    piece = dot_config(n, k, glu)[4]
    ks, pieces = (piece, -(-k // piece)) if piece else (-(-k // bk) * bk, 1)
    B = x.shape[0]
    out = x.new_empty(B, n)
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    yd = TensorDescriptor(out, list(out.shape), list(out.stride()), [bm, bn])
    tiles = triton.cdiv(B, bm) * triton.cdiv(n, bn)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if x.is_cuda else 3
    nprog = min(tiles, sms)
    grid = (nprog if persist else tiles,)
    _kernel()[grid](xd, wd, yd, out, B, n, KS=ks, PIECES=pieces, BM=bm, BN=bn, BK=bk, GLU=glu,
                    GELU=True, GROUP=group, PERSIST=persist, ONE=one, TSTORE=tstore, FLAT=flat,
                    NPROG=nprog, WS=ws, num_warps=nw, num_stages=st)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--models", default="1b,270m")
    ap.add_argument("--glu", choices=("both", "glu", "plain"), default="both")
    ap.add_argument("--variants", default=None,
                    help="PERSIST ONE TSTORE FLAT [WS] as 0/1 digits, comma-separated: 0100,01001")
    ap.add_argument("--tiles", default=None, help="bm.bn.bk.warps.stages, comma-separated")
    args = ap.parse_args()
    variants = VARIANTS if not args.variants else [
        tuple(c == "1" for c in v.ljust(5, "0")) for v in args.variants.split(",")]
    tiles = TILES if not args.tiles else [tuple(map(int, t.split("."))) for t in
                                          args.tiles.split(",")]
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    for model in args.models.split(","):
        for (n, k, glu) in SHAPES[model]:
            if args.glu != "both" and glu != (args.glu == "glu"):
                continue
            w = (torch.randn(2 * n if glu else n, k, device=dev) / k ** 0.5).to(dt)
            x = torch.randn(300, k, device=dev).to(dt)
            ref = torch.cat([dot_rows(x[i:i + 16], w, glu=glu, gelu=True, rows=16)
                             for i in range(0, 300, 16)])
            xb = torch.randn(args.rows, k, device=dev).to(dt)
            flops = 2 * args.rows * w.shape[0] * k
            piece = dot_config(n, k, glu)[4]
            t_cublas = timed(lambda: xb @ w.T)
            base = tma_tile(n, k, glu, args.rows) or (128, 128, 64, 8, 3)
            bk = base[2]
            ks, pieces = (piece, -(-k // piece)) if piece else (-(-k // bk) * bk, 1)
            t_def = timed(lambda: dot_tma(xb, w, xb.new_empty(args.rows, n), n, glu, True, None,
                                          base, ks, pieces, False))
            print(f"{model} ({n},{k},{'glu' if glu else '-'}) pieces {pieces}: cuBLAS "
                  f"{t_cublas:.3f} ms {flops / t_cublas / 1e9:.0f} TF/s; dot_tma {base} "
                  f"{t_def:.3f} ms {flops / t_def / 1e9:.0f} TF/s", flush=True)
            for tile in tiles:
                if glu and tile[1] >= 256:
                    continue
                for var in variants:
                    try:
                        eq = torch.equal(run(x, w, n, glu, tile, var), ref)
                        t = timed(lambda: run(xb, w, n, glu, tile, var), reps=50)
                        print(f"  {tile} persist={var[0]:d} one={var[1]:d} tstore={var[2]:d} "
                              f"flat={var[3]:d} ws={var[4]:d}: equal={eq} {t:.3f} ms {flops / t / 1e9:.0f} "
                              f"TF/s ({t / t_def:.2f}x dot_tma, {t / t_cublas:.2f}x cuBLAS)",
                              flush=True)
                    except Exception as e:                            # noqa: BLE001
                        print(f"  {tile} {var}: FAILED {type(e).__name__}: {str(e)[:160]}",
                              flush=True)


if __name__ == "__main__":
    main()
