"""Decode kernels at the Gemma-3-1B / 4B shapes on one GPU: batch-1 GEMV tilings vs cuBLAS, and
the one-launch decode attention's split / warp settings (rings full, growing planes at 2k / 32k).

For each shape (Gemma-3-1B / 4B projections; gate|up with act*mul fused), a CUDA graph of calls
over enough distinct weight copies to exceed the L2 several times is replayed; per-call time is
the median replay over the calls.  Prints one table (us per call, TB/s of weight bytes) and the
best tiling per shape -- the numbers behind `triton_gemv.GEMV_TILES`.  Attention: a graph of 26
launches over 26 distinct planes, per-launch us (and the separate qk_rope_store + attention).

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


ATTN = {"1b": dict(H=4, KV=1, D=256, window=512), "4b": dict(H=8, KV=4, D=256, window=1024)}


def attention_sweep(rows_out):
    from types import SimpleNamespace

    from muser.backends.cuda import triton_decode as td
    from muser.model import ops
    from muser.backends.cuda.triton_ops import qk_rope_store
    dt, dev, L = torch.bfloat16, "cuda", 26
    cos, sin = ops.rope_tables(10000.0, 1.0, 256, dev, 40000)
    for model, a in ATTN.items():
        H, KV, D = a["H"], a["KV"], a["D"]
        qkv = torch.randn(1, (H + 2 * KV) * D, device=dev).to(dt)
        qn, kn = torch.rand(D, device=dev) + 0.5, torch.rand(D, device=dev) + 0.5
        cases = [("ring", a["window"], None)] + [("growing", n, None) for n in (2049, 32769)]
        for kind, n, _ in cases:
            planes = []
            for _ in range(L):
                if kind == "ring":
                    k = torch.randn(n, KV, D, device=dev).to(dt)
                    planes.append(SimpleNamespace(keys=k, values=torch.randn_like(k), head_major=False, layer=0))
                else:
                    k = torch.randn(KV, n + 64, D, device=dev).to(dt)
                    planes.append(SimpleNamespace(keys=k, values=torch.randn_like(k), head_major=True, layer=0))
            tables = [torch.tensor([td.plane_row(p)], dtype=torch.int64, device=dev) for p in planes]
            slot = 100 if kind == "ring" else n - 1
            meta = torch.tensor([[slot, n]], dtype=torch.int64, device=dev)
            at = 5000 if kind == "ring" else n - 1          # a full ring: any position past it
            pos = torch.tensor([at], dtype=torch.int64, device=dev)
            cap = n if kind == "ring" else 0
            # layouts (triton_attn.layout): positions per split, merge group, key tile, warps --
            # the (block_n, warps) pairs compile without spills at D = 256 (ptxas, sm_90)
            if kind == "ring":
                grid = [dict(split=r, group=1 << 16, block_n=bn, warps=w, tag=f"split={r} bn={bn} w={w}")
                        for r, bn, w in ((32, 32, 4), (32, 16, 4), (64, 32, 4), (64, 64, 8), (128, 64, 8))]
            else:
                grid = [dict(split=r, group=g, block_n=bn, warps=w, tag=f"split={r} group={g} bn={bn} w={w}")
                        for r, g, bn, w in ((128, 16, 32, 4), (64, 16, 32, 4), (256, 16, 32, 4),
                                            (128, 16, 64, 8), (128, 8, 32, 4))]
            ref = None
            for cfg in grid:
                lay = {k: cfg[k] for k in ("split", "group", "block_n", "warps")}
                nsplit = td.splits_for(n if kind == "ring" else 40000, kind == "growing", cfg["split"])
                ws = td.DecodeWorkspace(1, KV, H // KV, D, nsplit, dev, td.merge_groups(nsplit, cfg["group"]))
                out = torch.empty(1, H, D, device=dev, dtype=dt)

                def call(t, lay=lay, nsplit=nsplit, ws=ws, out=out):
                    td.fused_decode_attention(qkv, pos, cos, sin, qn, kn, 1e-6, t, meta, H, KV, D,
                                              nsplit, 0.0625, None, False, ws=ws, out=out,
                                              capacity=cap, **lay)
                try:
                    t = time_graph(call, tables)
                except Exception as e:
                    print(model, kind, cfg["tag"], "FAILED", type(e).__name__, str(e)[:300], flush=True)
                    continue
                call(tables[0])
                if ref is None:
                    ref = out.float().clone()
                err = float((out.float() - ref).norm() / ref.norm())
                rows_out.append((f"attn {model} {kind} n={n}", f"fused {cfg['tag']}", t, err))
            cfg = grid[0]
            lay = {k: cfg[k] for k in ("split", "group", "block_n", "warps")}
            nsplit = td.splits_for(n if kind == "ring" else 40000, kind == "growing", cfg["split"])
            ws = td.DecodeWorkspace(1, KV, H // KV, D, nsplit, dev, td.merge_groups(nsplit, cfg["group"]))

            def sep(t, lay=lay, nsplit=nsplit, ws=ws):
                q = qk_rope_store(qkv, pos, cos, sin, qn, kn, 1e-6, t, meta, H, KV, D, False)
                td.decode_attention(q, pos, t, meta, KV, nsplit, 0.0625, None, ws=ws, capacity=cap, **lay)
            rows_out.append((f"attn {model} {kind} n={n}", f"separate {cfg['tag']}",
                             time_graph(sep, tables), 0.0))
            del planes, tables
            torch.cuda.empty_cache()


def main(argv=None):
    from muser.backends.cuda.triton_gemv import gemv, gemv_config
    from muser.backends.cuda.triton_rows import act_mul as act_halves

    def act_mul(gu, gelu):                                  # gate | up halves of one buffer
        return act_halves(gu[:, :gu.shape[1] // 2], gu[:, gu.shape[1] // 2:], gelu)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--what", default="gemv,attn")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if "attn" in args.what:
        arows = []
        attention_sweep(arows)
        print("\n| attention case | kernel | us/launch | rel diff vs first config |")
        for case, tag, t, err in arows:
            print(f"| {case} | {tag} | {t:.2f} | {err:.1e} |", flush=True)
    if "gemv" not in args.what:
        return
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
            t = time_graph(lambda w: act_mul(F.linear(x, w), True), ws)
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
