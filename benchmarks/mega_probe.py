"""Issue 17 item 6's first experiment: a decode layer's output projection, MLP half and the
next layer's qkv projection as one persistent launch (`triton_mega.mlp_block`, MUSER_MEGA=mlp)
against the six launches the decode step runs for them (o dot_rows, add_norm, gate|up
dot_rows, down dot_rows, add_norm, qkv dot_rows; dependent launches, MUSER_PDL's default),
both in a
CUDA graph over enough weight copies that the weights come from HBM, as a step reads them
(`dot_tiles_graph.py`'s method).  Checks the bits first; prints us per layer half.

    PYTHONPATH=.:benchmarks python3 benchmarks/mega_probe.py [270m] [1b] [--batches 1,16]

What it answers (benchmarks/NOTES.md, "Item 6"): does a counter wait cost less than a launch
boundary (~2.7 us)?
"""
import argparse
import itertools

import torch

# (hidden, ffn, heads x head_dim, q|k|v rows) per model (the 1B's down: split-K pieces)
SHAPES = {"270m": (640, 2048, 1024, 1536), "1b": (1152, 6912, 1024, 1536)}
BYTES = 256 << 20


def weights(n, f, hd, nq, copies, dev="cuda", dt=torch.bfloat16):
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for _ in range(copies):
        gu = (torch.randn(2 * f, n, device=dev, generator=g) / n ** 0.5).to(dt)
        dw = (torch.randn(n, f, device=dev, generator=g) / f ** 0.5).to(dt)
        wo = (torch.randn(n, hd, device=dev, generator=g) / hd ** 0.5).to(dt)
        wq = (torch.randn(nq, n, device=dev, generator=g) / n ** 0.5).to(dt)
        out.append((gu, dw, wo, wq))
    return out


def main():
    from decode_attn_probe import graph_us
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_dot_tiles import dot_config
    from muser.backends.cuda.triton_mega import mlp_block
    from muser.backends.cuda.triton_ops import add_norm
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["270m"])
    ap.add_argument("--batches", default="1,16")
    args = ap.parse_args()
    dev = "cuda"
    for m in args.models:
        n, f, hd, nq = SHAPES[m]
        if dot_config(f, n, True)[4]:
            print(f"{m}: its gate|up tile has split-K pieces; mlp_block does not take them")
            continue
        copies = max(8, -(-BYTES // ((3 * f + hd + nq) * n * 2)))
        ws = weights(n, f, hd, nq, copies)
        norms = [(torch.rand(n, device=dev) + 0.5) for _ in range(4)]
        for B in (int(b) for b in args.batches.split(",")):
            h = torch.randn(B, n, device=dev).to(torch.bfloat16)
            att = torch.randn(B, hd, device=dev).to(torch.bfloat16)
            cnt = torch.zeros(6, dtype=torch.int32, device=dev)

            def six(i):
                gu, dw, wo, wq = ws[i]
                o = dot_rows(att, wo, rows=16, pdl=True)
                h1, x1 = add_norm(h, norms[1], 1e-6, False, d1=o, w_post=norms[0], pdl=True)
                a = dot_rows(x1, gu, glu=True, gelu=True, rows=16, pdl=True)
                d = dot_rows(a, dw, rows=16, pdl=True, defer=True)    # MUSER_FUSE_SUM
                h2, x2 = add_norm(h1, norms[3], 1e-6, False, d1=d, w_post=norms[2], pdl=True)
                return h2, x2, dot_rows(x2, wq, rows=16, pdl=True)

            def one(i):
                gu, dw, wo, wq = ws[i]
                return mlp_block(h, None, norms[0], norms[1], gu, dw, norms[2], norms[3], 1e-6,
                                 out={"cnt": cnt}, att=att, wo=wo, wqkv=wq)
            a, b = six(0), one(0)
            torch.cuda.synchronize()
            same = all(torch.equal(x, y) for x, y in zip(a, b))
            t = {}
            for name, fn in (("six launches", six), ("one launch", one)):
                nxt = itertools.cycle(range(copies)).__next__
                t[name] = graph_us(lambda fn=fn: fn(nxt()), reps=copies, replays=10)
            floor = (3 * f + hd + nq) * n * 2 / 4.8e12 * 1e6
            print(f"{m} B{B}: six launches {t['six launches']:.2f} us | one persistent launch "
                  f"{t['one launch']:.2f} us | bits equal {same} | HBM floor {floor:.2f} us "
                  f"({copies} copies)", flush=True)


if __name__ == "__main__":
    main()
