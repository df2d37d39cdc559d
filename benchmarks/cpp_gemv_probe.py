"""Can a CUDA C++ decode projection keep dot_rows' bits and beat its time?  (issue 17, item 6:
"CUDA C++ through torch's extension loader where Triton does not reach the bandwidth").

`muser/backends/cuda/csrc/gemv_mma.cu` (MUSER_DOT_CPP's kernel) sums each output as dot_rows'
decode tile does (k16 MMA steps in order, mma.sync's own fragment layout) and ends it as
dot_rows does -- rounded (qkv, o, the head, an unsplit down), gelu(gate) * up (gate|up, in the
PTX Triton emits for it) or the split-K pieces' float32 sums (the 1B's down, which the add+norm
after it sums) -- but asks for a CTA's whole weight slab at once by bulk copies.  For each
decode projection of the Gemma-3 shapes:

    shape | PDL | Triton decode tile us | C++ us per (warps, n8 tiles a warp) | HBM floor us | bits

timed as dot_tiles_graph.py times tiles: one CUDA graph of launches over rotating weight copies
(>= 256 MB, so the weights come from HBM), without PDL and with it (the step's way: then the
C++ launch asks for its weights before it waits for the launch before).  Bits: the C++ output
against dot_rows(..., rows=16) (glu / defer as the step calls it) with torch.equal at B = 1, 5
and 16, where shared memory fits.  Builds the .cu as the engine does (cpp_dot.build, sm_90a).
`--quant int8`: the same with int8 rows (quant="int8": half the bytes, the row scales on the
finished sums) against dot_rows' fenced int8 tile; the floor column counts their bytes.

    PYTHONPATH=. python3 benchmarks/cpp_gemv_probe.py [--shapes 1b] [--variants 11,21,41,12,22]
                                                      [--quant int8]
"""
import argparse
import ctypes
import itertools
from pathlib import Path

import torch
from decode_attn_probe import graph_us as attn_graph_us
from int8_dot_probe import rotating

BYTES = 256 << 20
HBM = 4.3e12                       # bytes/s: the H200's measured copy rate (reads + writes)
SHAPES = {   # name -> (projection, n, k, glu): dot_rows' decode shapes (triton_dot_tiles)
    "270m": [("qkv", 1536, 640, False), ("o", 640, 1024, False), ("gate|up", 2048, 640, True),
             ("down", 640, 2048, False), ("head", 262144, 640, False)],
    "1b": [("qkv", 1536, 1152, False), ("o", 1152, 1024, False), ("gate|up", 6912, 1152, True),
           ("down", 1152, 6912, False)],
    "4b": [("qkv", 4096, 2560, False), ("o", 2560, 2048, False), ("gate|up", 10240, 2560, True),
           ("down", 2560, 10240, False)],
}
PLAIN, GLU, SPLIT = 0, 1, 2


def graph_us(fns) -> float:
    """us per launch: one graph over `fns` (each on its own weights), replayed ten times."""
    return attn_graph_us(rotating(lambda i: fns[i](), len(fns)), reps=len(fns), replays=10)


def triton_call(x, w, out, glu: bool, split: bool, pdl: bool = False):
    """dot_rows as the decode step calls it: the result (bf16 [B, n], or the pieces' float32
    sums [pieces, B, n] where the table splits K); w a bf16 matrix or int8 rows (RowInt8)."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.weights_int8 import RowInt8
    q, scale = (w.q, w.scale) if isinstance(w, RowInt8) else (w, None)
    if split:
        return dot_rows(x, q, scale=scale, rows=16, defer=True, pdl=pdl).part
    return dot_rows(x, q, scale=scale, out=out, glu=glu, gelu=glu, rows=16, pdl=pdl)


def main():
    from muser.backends.cuda.triton_dot_tiles import dot_config
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="270m,1b,4b")
    ap.add_argument("--variants", default="11,21,41,12,22",
                    help="warps a CTA and n8 tiles a warp, as two digits")
    ap.add_argument("--build-dir", default="/tmp/muser-native",
                    help="where cpp_dot.build puts the kernel")
    ap.add_argument("--quant", choices=("none", "int8"), default="none")
    args = ap.parse_args()
    from muser.backends.cuda.weights_int8 import quantize_rows
    wbytes = 1 if args.quant == "int8" else 2
    from muser.backends.cuda.cpp_dot import CppDot, build
    kern = CppDot(ctypes.CDLL(str(build(Path(args.build_dir)))), "on")
    variants = [(int(v[0]), int(v[1])) for v in args.variants.split(",")]
    g = torch.Generator(device="cuda").manual_seed(5)
    head = " | ".join(f"C++ {w}w x {nt}" for w, nt in variants)
    print(f"| model | shape (n x k) | PDL | Triton us | {head} | floor us | bits (B = 1, 5, 16) |")
    print("|---|---|---|---:|" + "---:|" * len(variants) + "---:|---|")
    for model in args.shapes.split(","):
        for name, n, k, glu in SHAPES[model]:
            piece = dot_config(n, k, glu)[4]
            split = bool(piece) and not glu
            mode, ks = (GLU if glu else SPLIT if split else PLAIN), piece or k
            rows = 2 * n if glu else n
            copies = max(4, -(-BYTES // (rows * k * wbytes)))
            ws = [(torch.randn(rows, k, device="cuda", generator=g) / k ** 0.5)
                  .to(torch.bfloat16) for _ in range(copies)]
            if wbytes == 1:
                ws = [quantize_rows(w) for w in ws]
            bits = []
            for B in (1, 5, 16):
                x = torch.randn(B, k, device="cuda", generator=g).to(torch.bfloat16)
                want = triton_call(x, ws[0], None, glu, split)
                for (wv, nt), pdl in itertools.product(variants, (False, True)):
                    y = torch.full_like(want, float("nan"))
                    tag = f"{B}:{wv}{nt}{'p' if pdl else ''}"
                    try:
                        kern(x, ws[0], n, (mode, ks, wv, nt), pdl, out=y)
                    except RuntimeError as e:
                        bits.append(f"{tag} {e}")
                        continue
                    torch.cuda.synchronize()
                    if not torch.equal(y, want):
                        bad = y != want
                        err = ((y.double() - want.double()).norm() / want.double().norm()).item()
                        bits.append(f"{tag} {int(bad.sum())} of {want.numel()} differ, "
                                    f"rel {err:.1e}")
            x = torch.randn(1, k, device="cuda", generator=g).to(torch.bfloat16)
            outs = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in ws]
            parts = [torch.empty(-(-k // ks), 1, n, device="cuda") for _ in ws]
            ys = parts if split else outs
            floor = rows * k * wbytes / HBM * 1e6
            for pdl in (False, True):
                tri = graph_us([lambda w=w, o=o: triton_call(x, w, o, glu, split, pdl)
                                for w, o in zip(ws, outs)])
                cols = []
                for wv, nt in variants:
                    calls = [lambda w=w, o=o, cta=(mode, ks, wv, nt): kern(x, w, n, cta, pdl, out=o)
                             for w, o in zip(ws, ys)]
                    try:
                        cols.append(f"{graph_us(calls):.2f}")
                    except RuntimeError:
                        cols.append("-")
                what = (f"{name} {n} x {k}" + (" (glu)" if glu else f" ({ks}-key pieces)"
                                               if split else "") + (" int8" if wbytes == 1 else ""))
                print(f"| {model} | {what} | {'on' if pdl else 'off'} | {tri:.2f} | "
                      f"{' | '.join(cols)} | {floor:.2f} | "
                      f"{'equal' if not bits else '; '.join(bits[:6])} |", flush=True)
            del ws, outs, parts


if __name__ == "__main__":
    main()
