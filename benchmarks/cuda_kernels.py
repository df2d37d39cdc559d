"""Batch-1 GEMV tilings vs cuBLAS at the decode shapes (one GPU), weights rotated past the L2.

For each shape (Gemma-3-1B / 4B projections; gate|up with act*mul fused), a CUDA graph of calls
over enough distinct weight copies to exceed the L2 several times is replayed; per-call time is
the median replay over the calls.  Prints one table (us per call, TB/s of weight bytes) and the
best tiling per shape -- the numbers behind `triton_ops.GEMV_BLOCK_N`.

    PYTHONPATH=. python3 benchmarks/cuda_kernels.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

SHAPES = [  # name, n (output rows; gate rows for glu), k, glu, gelu
    ("1b qkv", 1536, 1152, False), ("1b o", 1152, 1024, False), ("1b gu+act", 6912, 1152, True),
    ("1b down", 1152, 6912, False), ("4b qkv", 4096, 2560, False), ("4b o", 2560, 2048, False),
    ("4b gu+act", 10240, 2560, True), ("4b down", 2560, 10240, False),
]


def time_graph(fn, copies, reps=15):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in copies:
            fn(c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in copies:
            fn(c)
    g.replay()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ts = []
    for _ in range(reps):
        ev[0].record()
        g.replay()
        ev[1].record()
        torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]) * 1e3 / len(copies))
    return sorted(ts)[len(ts) // 2]


def main(argv=None):
    from muser.model.triton_ops import act_mul, gemv, gemv_config
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dt = torch.bfloat16
    rows, best = [], {}
    for name, n, k, glu in SHAPES:
        rn = 2 * n if glu else n
        nbytes = rn * k * 2
        ncopy = max(8, -(-400_000_000 // nbytes))
        ws = [torch.randn(rn, k, device="cuda").to(dt) for _ in range(ncopy)]
        x = torch.randn(1, k, device="cuda").to(dt)
        out = torch.empty(1, n, device="cuda", dtype=dt)
        ref = (act_mul(F.linear(x, ws[0]), True) if glu else F.linear(x, ws[0])).float()
        if glu:
            t = time_graph(lambda w: act_mul(F.linear(x, w), True, out=out), ws)
        else:
            t = time_graph(lambda w: torch.matmul(x, w.T, out=out), ws)
        res = {"cublas": t}
        rows.append((name, "cublas" + (" + act_mul" if glu else ""), t, nbytes / t / 1e6))
        default = gemv_config(n, k, glu)
        for bn in (1, 2, 4, 8, 16):
            for nw in (2, 4, 8):
                per_thread = bn * (1 << (k - 1).bit_length()) * (2 if glu else 1) // (32 * nw)
                if not 8 <= per_thread <= 256 or -(-n // bn) < 66:
                    continue
                try:
                    y = gemv(x, ws[0], glu=glu, gelu=True, block_n=bn, warps=nw)
                    err = float((y.float() - ref).norm() / ref.norm())
                    t = time_graph(lambda w: gemv(x, w, out=out, glu=glu, gelu=True, block_n=bn,
                                                  warps=nw), ws)
                except Exception as e:                       # report, keep sweeping
                    print(name, bn, nw, "FAILED", type(e).__name__, str(e)[:200], flush=True)
                    continue
                tag = f"gemv bn={bn} w={nw}" + (" (default)" if (bn, nw) == default else "")
                rows.append((name, tag, t, nbytes / t / 1e6))
                res[(bn, nw)] = t
                if err > 1e-2:
                    print(name, tag, "REL ERR", err, flush=True)
        cand = {c: v for c, v in res.items() if c != "cublas"}
        b = min(cand, key=cand.get)
        best[name] = {"n": n, "k": k, "glu": glu, "best": b, "best_us": cand[b],
                      "default": default, "default_us": cand.get(default), "cublas_us": res["cublas"]}
        print(f"{name}: cublas {res['cublas']:.2f} us, best gemv {b} {cand[b]:.2f} us, "
              f"default {default} {cand.get(default, float('nan')):.2f} us", flush=True)
        del ws
        torch.cuda.empty_cache()
    print("\n| shape | kernel | us/call | TB/s |")
    for name, tag, t, bw in rows:
        print(f"| {name} | {tag} | {t:.2f} | {bw:.2f} |")
    print("\nbest per shape:")
    for name, r in best.items():
        print(f"  {name}: {r}")
    with open(os.path.join(args.out, "cuda_kernels.json"), "w") as f:
        json.dump({k: {kk: str(vv) for kk, vv in v.items()} for k, v in best.items()}, f, indent=1)


if __name__ == "__main__":
    main()
