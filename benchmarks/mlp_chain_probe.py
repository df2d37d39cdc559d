"""Does a persistent MLP (or o + add+norm + MLP) beat its launches?  (issue 17, item 6: the megakernels' claim --
weights already on chip when a stage's input arrives -- at the smallest grain it can be tested.)

`muser/backends/cuda/csrc/mlp_chain.cu` (MUSER_DOT_CPP=mlp) runs gate|up (gelu(gate) * up) and
down in ONE launch: every CTA asks for its gate|up slab and its down slab before the PDL wait,
computes its gate|up columns, arrives at a grid barrier, and the down CTAs then read the whole
act row and sum from the slab already in shared memory.  Against dot_rows' two decode tiles:

    model | rows | PDL | add_norm + Triton gate|up + down us | add_norm + chain us, per CTA
    size (warps) | floor us (the MLP's weights) | bits

timed as cpp_gemv_probe.py times launches: one CUDA graph over rotating weight copies (>= 256
MB, so the weights come from HBM), without PDL and with it; an add_norm launch before each pair
(the step has one there) in both columns, so PDL has a launch before to overlap.  Bits: the
chain's y against dot_rows(dot_rows(x, wgu, glu, gelu), wd) with torch.equal at 1, 5, 16 rows.

Then the same for MUSER_DOT_CPP=omlp (`o` rows): o, add_norm, gate|up and down -- four Triton
launches -- against the one chain launch that makes h' and y, bits of both checked.

    PYTHONPATH=. python3 benchmarks/mlp_chain_probe.py [--shapes 270m] [--warps 1,2,4]
"""
import argparse
import ctypes
from pathlib import Path

import torch
from cpp_gemv_probe import graph_us

BYTES = 256 << 20
HBM = 4.3e12                       # bytes/s: the H200's measured copy rate (reads + writes)
SHAPES = {"270m": (640, 2048, 640, 1024), "tiny": (1024, 2048, 1024, 256)}  # k, i, h, ko (o's)


def main():
    from muser.backends.cuda.cpp_dot import CppDot, build
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_ops import add_norm
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="270m")
    ap.add_argument("--warps", default="1,2,4")
    ap.add_argument("--build-dir", default="/tmp/muser-native")
    args = ap.parse_args()
    dev = torch.device("cuda")
    kern = CppDot(ctypes.CDLL(str(build(Path(args.build_dir)))), "mlp", dev)
    sizes = [int(w) for w in args.warps.split(",")]
    g = torch.Generator(device="cuda").manual_seed(7)
    print(f"| model | rows | PDL | add_norm + Triton gate|up + down us | "
          f"{' | '.join(f'add_norm + chain {w}w' for w in sizes)} | floor us | bits (B = 1, 5, 16) |")
    print("|---|---:|---|---:|" + "---:|" * len(sizes) + "---:|---|")
    for model in args.shapes.split(","):
        k, i, h, ko = SHAPES[model]
        per = (2 * i * k + h * i) * 2
        copies = max(4, -(-BYTES // per))
        ws = [((torch.randn(2 * i, k, device=dev, generator=g) / k ** 0.5).bfloat16(),
               (torch.randn(h, i, device=dev, generator=g) / i ** 0.5).bfloat16())
              for _ in range(copies)]
        bits = []
        for rows in (1, 5, 16):
            x = torch.randn(rows, k, device=dev, generator=g).bfloat16()
            want = dot_rows(dot_rows(x, ws[0][0], glu=True, gelu=True, rows=16), ws[0][1],
                            rows=16)
            for w in sizes:
                for pdl in (False, True):
                    y = kern.mlp(x, ws[0][0], ws[0][1], pdl, warps=w)
                    torch.cuda.synchronize()
                    if y is None:
                        bits.append(f"{rows}:{w}w not taken")
                    elif not torch.equal(y, want):
                        bits.append(f"{rows}:{w}w{'p' if pdl else ''} "
                                    f"{int((y != want).sum())} of {want.numel()} differ")
        for rows in (1, 16):
            h0 = torch.randn(rows, k, device=dev, generator=g).bfloat16()
            d1 = torch.randn(rows, k, device=dev, generator=g).bfloat16()
            wn = 1 + torch.rand(k, device=dev, generator=g)
            x = add_norm(h0, wn, 1e-6, False, d1=d1)[1]

            def pair(wgu, wd, pdl):
                xx = add_norm(h0, wn, 1e-6, False, d1=d1, pdl=pdl)[1]
                a = dot_rows(xx, wgu, glu=True, gelu=True, rows=16, pdl=pdl)
                return dot_rows(a, wd, rows=16, pdl=pdl)

            def chained(wgu, wd, pdl, w):
                xx = add_norm(h0, wn, 1e-6, False, d1=d1, pdl=pdl)[1]
                if kern.mlp(xx, wgu, wd, pdl, warps=w) is None:
                    raise RuntimeError("not taken")

            for pdl in (False, True):
                tri = graph_us([lambda a=a, b=b: pair(a, b, pdl) for a, b in ws])
                cols = []
                for w in sizes:
                    try:
                        cols.append(f"{graph_us([lambda a=a, b=b, w=w: chained(a, b, pdl, w) for a, b in ws]):.2f}")
                    except RuntimeError:
                        cols.append("-")
                print(f"| {model} | {rows} | {'on' if pdl else 'off'} | {tri:.2f} | "
                      f"{' | '.join(cols)} | {per / HBM * 1e6:.2f} | "
                      f"{'equal' if not bits else '; '.join(bits[:6])} |", flush=True)
            del x
        o_rows(kern, model, ko, h, i, sizes, ws, g)
        del ws


def o_rows(kern, model, ko, h, i, sizes, ws, g):
    """MUSER_DOT_CPP=omlp: o + add_norm + the MLP, four launches against one -- bits, then us."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_ops import add_norm
    dev = ws[0][0].device
    wos = [(torch.randn(h, ko, device=dev, generator=g) / ko ** 0.5).bfloat16() for _ in ws]
    wp, wn = (1 + torch.rand(2, h, device=dev, generator=g)).unbind(0)
    for rows in (1, 16):
        a = torch.randn(rows, ko, device=dev, generator=g).bfloat16()
        hh = (8 * torch.randn(rows, h, device=dev, generator=g)).bfloat16()

        def four(wo, wgu, wd, pdl):
            o = dot_rows(a, wo, rows=16, pdl=pdl)
            h2, x = add_norm(hh, wn, 1e-6, False, d1=o, w_post=wp, pdl=pdl)
            return h2, dot_rows(dot_rows(x, wgu, glu=True, gelu=True, rows=16, pdl=pdl), wd,
                                rows=16, pdl=pdl)

        def one(wo, wgu, wd, pdl, w):
            got = kern.o_mlp(a, wo, hh, wp, wn, 1e-6, wgu, wd, pdl, warps=w)
            if got is None:
                raise RuntimeError("not taken")
            return got

        bits = []
        want = four(wos[0], *ws[0], False)
        for w in sizes:
            try:
                got = one(wos[0], *ws[0], True, w)
            except RuntimeError:
                bits.append(f"{w}w not taken")
                continue
            torch.cuda.synchronize()
            bits += [f"{w}w {what} {int((p != q).sum())} differ"
                     for what, p, q in zip(("h'", "y"), got, want) if not torch.equal(p, q)]
        for pdl in (False, True):
            tri = graph_us([lambda wo=wo, p=p: four(wo, *p, pdl) for wo, p in zip(wos, ws)])
            cols = []
            for w in sizes:
                try:
                    cols.append(f"{graph_us([lambda wo=wo, p=p, w=w: one(wo, *p, pdl, w) for wo, p in zip(wos, ws)]):.2f}")
                except RuntimeError:
                    cols.append("-")
            print(f"| {model} omlp (o + add_norm + MLP) | {rows} | {'on' if pdl else 'off'} | "
                  f"{tri:.2f} | {' | '.join(cols)} | - | "
                  f"{'equal' if not bits else '; '.join(bits[:6])} |", flush=True)


if __name__ == "__main__":
    main()
