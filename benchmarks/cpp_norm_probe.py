"""Does making x inside the projection pay?  (MUSER_DOT_CPP=norm; issue 17, item 6: fewer
launches a layer.)  The eighteenth session's Triton norm-in prologue kept the bits and lost
(every program stored h' and x, and its reduction sat in front of the weight stream); the C++
kernel asks for its weights first, norms while they land, and one CTA stores h'.

For the add+norm before each qkv and gate|up of the Gemma-3 shapes, us per pair in one CUDA
graph over rotating weight copies (>= 256 MB: weights from HBM), PDL on as in the step:

    model | projection (delta before it) | add_norm + dot_rows | add_norm + C++ | C++ norm-in | bits

bits: h', x and the projection of the norm-in launch against add_norm then dot_rows,
torch.equal, at B = 1, 5 and 16 (the first to differ says where: h' the first tree or the bf16
add, x the second tree, y the projection).  The delta: the o projection's bf16 output before
gate|up; before qkv the down projection's -- its float32 split-K pieces where the tile table
splits it (the 1B: 7).

    PYTHONPATH=. python3 benchmarks/cpp_norm_probe.py [--shapes 270m,1b,4b]
"""
import argparse
import ctypes
from pathlib import Path

import torch
from cpp_gemv_probe import BYTES, graph_us

SHAPES = {   # name -> [(projection, n, k, glu, pieces of the delta)]
    "270m": [("qkv", 1536, 640, False, 0), ("gate|up", 2048, 640, True, 0)],
    "1b": [("qkv", 1536, 1152, False, 7), ("gate|up", 6912, 1152, True, 0)],
    "4b": [("qkv", 4096, 2560, False, 0), ("gate|up", 10240, 2560, True, 0)],
}
EPS = 1e-6


def main():
    from muser.backends.cuda.cpp_dot import CppDot, build
    from muser.backends.cuda.triton_dot import Pieces, dot_rows
    from muser.backends.cuda.triton_ops import add_norm
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="270m,1b,4b")
    ap.add_argument("--build-dir", default="/tmp/muser-native")
    args = ap.parse_args()
    kern = CppDot(ctypes.CDLL(str(build(Path(args.build_dir)))), "norm")
    g = torch.Generator(device="cuda").manual_seed(7)
    print("| model | projection (n x k) | add_norm + dot_rows us | add_norm + C++ us | "
          "C++ norm-in us | bits (B = 1, 5, 16) |")
    print("|---|---|---:|---:|---:|---|")

    def operands(B, k, pieces):
        h = (8 * torch.randn(B, k, device="cuda", generator=g)).bfloat16()
        d1 = (Pieces(torch.randn(pieces, B, k, device="cuda", generator=g), None) if pieces
              else torch.randn(B, k, device="cuda", generator=g).bfloat16())
        return h, d1

    for model in args.shapes.split(","):
        for name, n, k, glu, pieces in SHAPES[model]:
            rows = 2 * n if glu else n
            copies = max(4, -(-BYTES // (rows * k * 2)))
            ws = [(torch.randn(rows, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
                  for _ in range(copies)]
            w_post, w_next = (1 + torch.rand(2, k, device="cuda", generator=g)).unbind(0)
            bits = []
            for B in (1, 5, 16):
                h, d1 = operands(B, k, pieces)
                plan = kern.norm_plan(h, d1, w_post, w_next, ws[0], n, glu, glu, 0, False)
                if plan is None:
                    bits.append(f"{B}: not taken")
                    continue
                h_want, x = add_norm(h, w_next, EPS, False, d1=d1, w_post=w_post)
                want = dot_rows(x, ws[0], glu=glu, gelu=glu, rows=16)
                x_got = torch.full_like(x, float("nan"))
                h_got, got = kern.norm(h, d1, w_post, w_next, EPS, ws[0], n, plan, True,
                                       x_out=x_got)
                torch.cuda.synchronize()
                for what, a, b in (("h'", h_got, h_want), ("x", x_got, x), ("y", got, want)):
                    if not torch.equal(a, b):
                        bits.append(f"{B}: {what} {int((a != b).sum())} of {b.numel()} differ")
            h, d1 = operands(1, k, pieces)
            plan = kern.norm_plan(h, d1, w_post, w_next, ws[0], n, glu, glu, 0, False)
            cpp_plan = kern.plan(h, ws[0], n, glu, glu, 0, False)

            def triton(w):
                x = add_norm(h, w_next, EPS, False, d1=d1, w_post=w_post, pdl=True)[1]
                return dot_rows(x, w, glu=glu, gelu=glu, rows=16, pdl=True)

            def then_cpp(w):
                x = add_norm(h, w_next, EPS, False, d1=d1, w_post=w_post, pdl=True)[1]
                return kern(x, w, n, cpp_plan, True)

            cols = [graph_us([lambda w=w: triton(w) for w in ws])]
            cols.append(graph_us([lambda w=w: then_cpp(w) for w in ws]) if cpp_plan else None)
            cols.append(graph_us([lambda w=w: kern.norm(h, d1, w_post, w_next, EPS, w, n, plan,
                                                        True) for w in ws]) if plan else None)
            what = f"{name} {n} x {k}" + (f" ({pieces} pieces before)" if pieces else "")
            print(f"| {model} | {what} | " +
                  " | ".join("-" if c is None else f"{c:.2f}" for c in cols) +
                  f" | {'equal' if not bits else '; '.join(bits[:6])} |", flush=True)
            del ws


if __name__ == "__main__":
    main()
