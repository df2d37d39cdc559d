"""`dot_rows` chunk tiles measured as a captured chunk pass runs them (CUDA): in a graph.

A 512-token prefill of the 1B is 5.4 ms of wall time, 4.2 ms of it in dot_rows (105 launches in
its chunk graph; twenty-sixth session) -- ~170 TFLOP/s, where a 16k prompt's tiles reach ~690.
`tma_dot_probe.py` / `dot_chunk_sweep.py` time one launch from Python, which at 512 rows is the
host's launch cost, not the tile's.  Here each (shape, rows, tile) is a graph of launches over
enough weight copies to pass 256 MB (the weights come from HBM, as a layer's do), and every
tile's output is first checked bitwise against the default route's (speed fields only: the
split-K pieces are the arithmetic).  Split-K pieces are left unsummed (`defer`), as the engine
leaves a down projection's for the add+norm after it.

    PYTHONPATH=.:benchmarks python3 benchmarks/chunk_tiles_graph.py [1b,270m] [--rows 512,2048]
"""
import argparse
import itertools

import torch

from dot_tiles_graph import SHAPES, operands

# (block_m, block_n, block_k, warps, stages), tma
TILES = [((64, 128, 64, 4, 4), False), ((64, 64, 128, 4, 3), False), ((64, 128, 128, 8, 2), False),
         ((64, 256, 64, 8, 3), False), ((32, 128, 128, 4, 3), False), ((16, 128, 256, 4, 3), False),
         ((128, 128, 64, 8, 3), False), ((128, 128, 64, 8, 3), True), ((128, 64, 64, 8, 4), True),
         ((128, 256, 64, 8, 3), True), ((64, 128, 64, 4, 4), True), ((64, 64, 64, 4, 4), True)]


def run(x, w, out, glu, tile, tma, defer):
    from muser.backends.cuda.triton_dot import dot_rows
    return dot_rows(x, w, out, glu=glu, gelu=glu, tile=tile, tma=tma, pdl=True, defer=defer)


def sweep(n, k, glu, rows):
    from decode_attn_probe import graph_us
    from muser.backends.cuda.triton_dot_tiles import tma_pays
    wr = 2 * n if glu else n
    copies, ws, x, outs = operands(n, k, glu, rows, least=4)
    engine_tma = tma_pays(wr * k, rows)          # the route MUSER_DOT_TMA=auto takes
    want = run(x, ws[0], None, glu, None, engine_tma, False)
    res = []
    for tile, tma in [(None, engine_tma)] + TILES:
        try:
            got = run(x, ws[0], None, glu, tile, tma, False)
            torch.cuda.synchronize()
        except Exception as e:                          # noqa: BLE001 (shared memory, etc.)
            print(f"  {tile} tma={tma}: FAILED {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        if not torch.equal(got, want):
            print(f"  {tile} tma={tma}: BITS DIFFER -- skipped", flush=True)
            continue
        nxt = itertools.cycle(range(copies)).__next__
        t = graph_us(lambda: run(x, ws[(i := nxt())], outs[i], glu, tile, tma, True),
                     reps=copies, replays=10)
        res.append((t, "default" if tile is None else f"{tile}{' tma' if tma else ''}"))
    flops = 2 * rows * wr * k
    base = res[0][0] if res and res[0][1] == "default" else float("nan")
    best = sorted(res)[:4]
    print(f"{n}x{k}{' glu' if glu else ''} {rows} rows: default {base:.1f} us "
          f"({flops / base / 1e6:.0f} TF/s) | best " +
          ", ".join(f"{t:.1f} us {name} ({flops / t / 1e6:.0f} TF/s)" for t, name in best),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="?", default="1b,270m")
    ap.add_argument("--rows", default="512,2048")
    args = ap.parse_args()
    for m in args.models.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            for n, k, glu in SHAPES[m]:
                sweep(n, k, glu, rows)


if __name__ == "__main__":
    main()
