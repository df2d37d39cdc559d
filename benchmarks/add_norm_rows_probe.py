"""Can add_norm take several rows a program at 16k rows with the same bits?  (issue 12, 16k rule)

The 1B's 16k prefill spends 4.5 ms in 52 add_norm launches (~87 us each) where each moves ~151 MB
(h and the delta in, h' and the normed x out: ~38 us at 4 TB/s).  add_norm is one row a program
(its block and warps are the reduction's tree, `triton_ops._row_shape`, shared with the decode
step), 16,384 short programs.  Two ways to give a program more rows, each to be checked
`torch.equal` against add_norm before it is timed:

- LOOP: R rows a program, one after another, through the very same 1-D code (`_norm_inputs`,
  `_add_norm_tail`): the same instructions a row, so the same bits by construction.
- TILE: a [R, BLOCK] tile reduced along its rows (Gemma's RMS norm, POST + NEXT): the same bits
  only if Triton lays each row out as the 1-D launch does -- the test says.

    PYTHONPATH=.:benchmarks python3 benchmarks/add_norm_rows_probe.py [--rows 16384] [--n 1152]
"""
import argparse
import functools

import torch

from cuda_measure import timed
from muser.backends.cuda.triton_ops import _row_shape, add_norm
from muser.backends.cuda.triton_pieces import norm_pieces


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl
    globals()["tl"] = tl
    pieces = norm_pieces()
    globals().update(pieces)            # Triton resolves a kernel's callees in module globals
    global _norm_inputs, _add_norm_tail         # named, so a reader (and the name check) sees them
    _norm_inputs, _add_norm_tail = pieces["_norm_inputs"], pieces["_add_norm_tail"]

    @triton.jit
    def loop_kernel(H, D1, W_POST, W_NEXT, H_OUT, X_OUT, eps, B, N: tl.constexpr,
                    BLOCK: tl.constexpr, R: tl.constexpr):
        i = tl.arange(0, BLOCK)
        mask = i < N
        for r in range(R):
            row = tl.program_id(0).to(tl.int64) * R + r
            if row < B:
                h, d1 = _norm_inputs(H, D1, H, row, i, mask, 1, N, True, 0, False)  # noqa: F821
                _add_norm_tail(h, d1, row, i, mask, H, W_POST, W_NEXT, H_OUT,       # noqa: F821
                               X_OUT, eps, N, True, False, True, False, True)

    @triton.jit
    def tile_kernel(H, D1, W_POST, W_NEXT, H_OUT, X_OUT, eps, B, N: tl.constexpr,
                    BLOCK: tl.constexpr, R: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
        i = tl.arange(0, BLOCK)
        mask = (rows < B)[:, None] & (i < N)[None, :]
        at = rows[:, None] * N + i[None, :]
        h = tl.load(H + at, mask=mask, other=0.0)
        d1 = tl.load(D1 + at, mask=mask, other=0.0).to(tl.float32)
        wp = tl.load(W_POST + i, mask=i < N, other=0.0)[None, :]
        d1 = d1 * tl.rsqrt(tl.sum(d1 * d1, 1) / N + eps)[:, None] * wp
        d1 = d1.to(h.dtype).to(tl.float32)
        h = (h.to(tl.float32) + d1).to(h.dtype)
        tl.store(H_OUT + at, h, mask=mask)
        wn = tl.load(W_NEXT + i, mask=i < N, other=0.0)[None, :]
        x = h.to(tl.float32)
        x = x * tl.rsqrt(tl.sum(x * x, 1) / N + eps)[:, None] * wn
        tl.store(X_OUT + at, x.to(h.dtype), mask=mask)

    return loop_kernel, tile_kernel


def run(kind, h, d1, wp, wn, R, warps=None):
    import triton
    B, N = h.shape
    ho, xo = torch.empty_like(h), torch.empty_like(h)
    shape = _row_shape(N)
    if warps:
        shape = {**shape, "num_warps": warps}
    kern = _kernels()[0 if kind == "loop" else 1]
    kern[(triton.cdiv(B, R),)](h, d1, wp, wn, ho, xo, 1e-6, B, N=N, R=R, **shape)
    return ho, xo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--n", default="1152,640")
    args = ap.parse_args()
    torch.manual_seed(0)
    dt = torch.bfloat16
    for N in map(int, args.n.split(",")):
        h = torch.randn(args.rows, N, device="cuda").to(dt)
        d1 = (torch.randn(args.rows, N, device="cuda") * 3).to(dt)
        wp = (torch.rand(N, device="cuda") + 0.5).to(dt)
        wn = (torch.rand(N, device="cuda") + 0.5).to(dt)
        ref = add_norm(h, wn, 1e-6, False, d1=d1, w_post=wp)
        t0 = timed(lambda: add_norm(h, wn, 1e-6, False, d1=d1, w_post=wp), reps=50)
        gb = 4 * h.numel() * h.element_size() / 1e9
        print(f"N {N}, {args.rows} rows: add_norm {t0 * 1e3:.1f} us ({gb / t0:.2f} TB/s)",
              flush=True)
        for kind, R, warps in [("loop", 2, None), ("loop", 4, None), ("loop", 8, None),
                               ("tile", 2, None), ("tile", 4, None), ("tile", 8, None),
                               ("tile", 4, 8), ("tile", 8, 8)]:
            try:
                got = run(kind, h, d1, wp, wn, R, warps)
                eq = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
                t = timed(lambda: run(kind, h, d1, wp, wn, R, warps), reps=50)
                print(f"  {kind} R {R} warps {warps or _row_shape(N)['num_warps']}: equal={eq} "
                      f"{t * 1e3:.1f} us ({gb / t:.2f} TB/s, {t / t0:.2f}x)", flush=True)
            except Exception as e:                                    # noqa: BLE001
                print(f"  {kind} R {R}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)


if __name__ == "__main__":
    main()
