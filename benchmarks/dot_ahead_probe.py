"""MUSER_DOT_AHEAD per launch (CUDA): dot_rows' decode tile against the weights-ahead tile
(triton_dot_ahead.py) on the shapes it takes, as a decode step runs them -- a graph of
dependent launches with PDL, each launch on its own copy of the weights (past the L2, so they
come from HBM); every output checked bitwise against dot_rows' first.

    PYTHONPATH=. python3 benchmarks/dot_ahead_probe.py [--rows 1 16]
"""
import argparse
import itertools

import torch

from dot_tiles_graph import BYTES, per_launch_us

SHAPES = {"270m qkv": (1536, 640, False), "270m o": (640, 1024, False),
          "1b qkv": (1536, 1152, False), "1b o": (1152, 1024, False)}


def main():
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_dot_ahead import dot_ahead
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    a = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}: us a launch, graph, PDL, weights from HBM\n")
    print("| shape | rows | dot_rows | ahead | same bits |\n|---|---:|---:|---:|---|")
    for (name, (n, k, glu)), rows in itertools.product(SHAPES.items(), a.rows):
        per = (2 * n if glu else n) * k * 2
        copies = max(2, BYTES // per)
        ws = [torch.randn(2 * n if glu else n, k, device="cuda", dtype=torch.bfloat16) * 0.05
              for _ in range(copies)]
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        same = all(torch.equal(dot_ahead(x, w, glu, glu, pdl=True),
                               dot_rows(x, w, glu=glu, gelu=glu, pdl=True)) for w in ws[:4])
        base = per_launch_us(lambda i: dot_rows(x, ws[i], glu=glu, gelu=glu, pdl=True), copies)
        ahead = per_launch_us(lambda i: dot_ahead(x, ws[i], glu, glu, pdl=True), copies)
        print(f"| {name} | {rows} | {base:.2f} | {ahead:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
