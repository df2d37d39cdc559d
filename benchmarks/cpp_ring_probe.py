"""Does streaming the weights through a ring of slots make the CUDA C++ projection pay?
(issue 17, item 6; MUSER_DOT_CPP=ring, csrc/gemv_ring.cuh.)

The slab kernel (MUSER_DOT_CPP=on) kept dot_rows' bits and lost on the big projections: a CTA
held its whole weight slab, so one to three CTAs an SM (thirty-ninth session).  The ring kernel
keeps the same sums and streams KC keys a slot through S slots, by CTAs small enough that
several share an SM, walking items until none are left.  For each decode projection of the
Gemma-3 shapes, us a launch (one CUDA graph over rotating weight copies >= 256 MB, so the
weights come from HBM; PDL on, the step's way):

    shape | Triton decode tile | slab (on) | ring (auto) | ring WN:KC:S ... | floor | bits

bits: each kernel's output against dot_rows' (torch.equal) at --rows rows.  Builds the .cu as
the engine does (cpp_dot.build, sm_90a).

    PYTHONPATH=. python3 benchmarks/cpp_ring_probe.py [--shapes 270m,1b,4b] [--rows 1]
        [--configs 11:256:4,11:512:4,21:256:4,12:256:4,11:128:8] [--quant int8]
"""
import argparse
import ctypes
from pathlib import Path

import torch
from cpp_gemv_probe import HBM, SHAPES, graph_us, triton_call, weight_copies


def main():
    from muser.backends.cuda.cpp_dot import CppDot, build
    from muser.backends.cuda.triton_dot_tiles import dot_config
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="270m,1b,4b")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--configs", default="11:256:4,11:512:4,21:256:4,12:256:4,11:128:8",
                    help="ring shapes WN:KC:S (warps and n8 tiles a warp, keys a slot, slots)")
    ap.add_argument("--build-dir", default="/tmp/muser-native")
    ap.add_argument("--quant", choices=("none", "int8"), default="none")
    args = ap.parse_args()
    wbytes = 1 if args.quant == "int8" else 2
    lib = ctypes.CDLL(str(build(Path(args.build_dir))))
    names = ["on", "ring"] + [f"ring:{c}" for c in args.configs.split(",")]
    kerns = {v: CppDot(lib, v) for v in names}
    g = torch.Generator(device="cuda").manual_seed(5)
    print(f"rows {args.rows}, {args.quant}; us a launch, PDL on, weights from HBM")
    print("| model | shape (n x k) | Triton | " + " | ".join(names) + " | floor | bits |")
    print("|---|---|---:|" + "---:|" * len(names) + "---:|---|")
    for model in args.shapes.split(","):
        for name, n, k, glu in SHAPES[model]:
            if name == "head":
                continue
            piece = dot_config(n, k, glu)[4]
            split = bool(piece) and not glu
            rows = 2 * n if glu else n
            ws = weight_copies(rows, k, wbytes, g)
            x = torch.randn(args.rows, k, device="cuda", generator=g).to(torch.bfloat16)
            want = triton_call(x, ws[0], None, glu, split)
            outs = [torch.empty_like(want) for _ in ws]
            tri = graph_us([lambda w=w, o=o: triton_call(x, w, None if split else o, glu, split,
                                                          True) for w, o in zip(ws, outs)])
            cols, bad = [], []
            for v in names:
                plan = kerns[v].plan(x, ws[0], n, glu, glu, piece, True)
                if plan is None:
                    cols.append("-")
                    continue
                got = kerns[v](x, ws[0], n, plan, True)
                torch.cuda.synchronize()
                if not torch.equal(got, want):
                    bad.append(f"{v}: {int((got != want).sum())} differ")
                us = graph_us([lambda w=w, o=o, p=plan, kv=kerns[v]: kv(x, w, n, p, True, out=o)
                               for w, o in zip(ws, outs)])
                cols.append(f"{us:.2f}")
            floor = rows * k * wbytes / HBM * 1e6
            what = f"{name} {n} x {k}" + (" (glu)" if glu else f" ({piece}-key pieces)"
                                          if split else "")
            print(f"| {model} | {what} | {tri:.2f} | {' | '.join(cols)} | {floor:.2f} | "
                  f"{'equal' if not bad else '; '.join(bad)} |", flush=True)
            del ws, outs


if __name__ == "__main__":
    main()
