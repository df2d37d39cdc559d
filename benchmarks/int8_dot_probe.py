"""int8 weights through `dot_rows` at batch 1 (CUDA): what a GPU int8 weight mode would buy per
projection (issue 17, item 2; accuracy: gpu_weight_accuracy.py).

For each decode shape of the Gemma-3 270M / 1B / 4B (and their heads): the same [N, K] product
with bf16 weights, with int8 weights + float32 row scales (quant="int8") and with int8 blocks of
32 keys + float16 scales dequantized in the tile (BlockInt8, quant="int8-head"; `--heads` times
the heads alone; and quant="int8-head-fast"'s own head tile, int8 rows unfenced: `fast`), one
row, the decode tiles; enough
weight copies rotated between calls to defeat the 50 MB L2, so each call reads its weights from
HBM as a decode step does.  Also checks that a 16-row call and a 1-row call give the row the same
bits (the batch invariance a decode step relies on).

    PYTHONPATH=. python3 benchmarks/int8_dot_probe.py [--heads]
    PYTHONPATH=. python3 benchmarks/int8_dot_probe.py --sweep    # the heads' tiles (below)

`--sweep`: the heads alone as the greedy step runs them (a picking tile, one row), bf16 and
BlockInt8 weights, over tiles (block_n, block_k, warps, stages): none of them changes a bit
(a sum is its k16 MMA steps in order, whatever the tile; no split-K pieces on a head), so the
fastest block tile can be the int8-head mode's own.
"""
import argparse

import torch

from cuda_measure import timed
from muser.backends.cuda.triton_dot import dot_rows
from muser.backends.cuda.weights_int8 import quantize_blocks, quantize_rows

SHAPES = {"270m": [(1536, 640, False), (640, 1024, False), (2048, 640, True), (640, 2048, False),
                   (262144, 640, False)],
          "1b": [(1536, 1152, False), (1152, 1024, False), (6912, 1152, True), (1152, 6912, False),
                 (262144, 1152, False)],
          "4b": [(4096, 2560, False), (2560, 2048, False), (10240, 2560, True), (2560, 10240, False)]}


def hbm_copies(rows: int, k: int, elem_bytes: int) -> int:
    """How many weight copies to rotate between calls so each call reads HBM: > 3x the L2."""
    return max(2, -(-(160 << 20) // (rows * k * elem_bytes)))


def rotating(call, copies: int):
    """A no-argument function calling `call(i)` with i = 1, 2, .. copies - 1, 0, 1, .."""
    it = {"i": 0}

    def run():
        it["i"] = (it["i"] + 1) % copies
        return call(it["i"])
    return run


SWEEP = [(bn, bk, w, st) for bn in (64, 128) for bk in (128, 256) for w in (4, 8)
         for st in (3, 4, 6) if bn * bk * st <= 128 * 256 * 4] + [(32, 256, 4, 4), (32, 256, 4, 6)]


def sweep(dev: str) -> None:
    """Each head's picking tile at one row over SWEEP, bf16 and BlockInt8 (us, HBM-fed)."""
    print("| model | weights | tile (bn, bk, warps, stages) | us | GB/s |")
    print("|---|---|---|---:|---:|")
    for model, k in (("270m", 640), ("1b", 1152), ("4b", 2560)):
        n = 262144
        copies = hbm_copies(n, k, 1)
        wb = [torch.randn(n, k, device=dev).to(torch.bfloat16) for _ in range(copies)]
        blocks = [quantize_blocks(w) for w in wb]
        x = torch.randn(1, k, device=dev).to(torch.bfloat16)
        for kind, ws, ss, nbytes, tiles in (
                ("bf16", wb, [None] * copies, n * k * 2, [(64, 128, 4, 4)]),     # the default
                ("blocks", [b.q for b in blocks], [b.scale for b in blocks], n * k + n * k // 16,
                 SWEEP)):
            best = None
            for cfg in tiles:
                run = rotating(lambda i: dot_rows(x, ws[i], scale=ss[i], pick=True,
                                                  config=cfg + (0,)), copies)
                try:
                    t = timed(run, reps=100) * 1e3
                except Exception as e:                      # a tile that does not fit (smem)
                    print(f"| {model} | {kind} | {cfg} | {type(e).__name__} | |", flush=True)
                    continue
                best = min(best or (t, cfg), (t, cfg))
                print(f"| {model} | {kind} | {cfg} | {t:.2f} | {nbytes / t / 1e3:.0f} |", flush=True)
            print(f"| {model} | {kind} | **best {best[1]}** | **{best[0]:.2f}** | |", flush=True)
        del wb, blocks
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", action="store_true", help="the 262,144-row heads only (+ the 4B's)")
    ap.add_argument("--sweep", action="store_true", help="the heads' picking tiles over SWEEP")
    args = ap.parse_args()
    heads = args.heads
    if args.sweep:
        return sweep("cuda")
    dev = "cuda"
    torch.manual_seed(0)
    print("| model | n, k, glu | bf16 us | int8 us | int8 / bf16 | blocks us | blocks / bf16 | "
          "fast us | fast / bf16 | bf16 GB/s | int8 GB/s | 1-row == 16-row |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    head_4b = [(262144, 2560, False)]
    shapes_of = {m: ([s for s in v if s[0] == 262144] + (head_4b if m == "4b" else []))
                 if heads else v for m, v in SHAPES.items()}
    for model, shapes in shapes_of.items():
        for n, k, glu in shapes:
            rows = 2 * n if glu else n
            copies = hbm_copies(rows, k, 2)
            wb = [torch.randn(rows, k, device=dev).to(torch.bfloat16) for _ in range(copies)]
            int8 = [quantize_rows(w) for w in wb]
            wq, sc = [r.q for r in int8], [r.scale for r in int8]
            blocks = [quantize_blocks(w) for w in wb]
            bq, bs = [b.q for b in blocks], [b.scale for b in blocks]
            x = torch.randn(16, k, device=dev).to(torch.bfloat16)

            def one_row(ws, ss=None, **kw):
                return rotating(lambda i: dot_rows(x[:1], ws[i], glu=glu, **kw,
                                                   scale=None if ss is None else ss[i]), copies)
            fast = {"rows": 16, "own_tile": True}
            tb = timed(one_row(wb), reps=200) * 1e3
            tq = timed(one_row(wq, sc), reps=200) * 1e3
            tk = timed(one_row(bq, bs), reps=200) * 1e3
            tf = timed(one_row(wq, sc, **fast), reps=200) * 1e3
            same = (torch.equal(dot_rows(x, wq[0], glu=glu, scale=sc[0])[:1],
                                dot_rows(x[:1], wq[0], glu=glu, scale=sc[0]))
                    and torch.equal(dot_rows(x, bq[0], glu=glu, scale=bs[0])[:1],
                                    dot_rows(x[:1], bq[0], glu=glu, scale=bs[0]))
                    and torch.equal(dot_rows(x, wq[0], glu=glu, scale=sc[0], **fast)[:1],
                                    dot_rows(x[:1], wq[0], glu=glu, scale=sc[0], **fast)))
            print(f"| {model} | {n}, {k}, {glu} | {tb:.2f} | {tq:.2f} | {tq / tb:.2f} | {tk:.2f} | "
                  f"{tk / tb:.2f} | {tf:.2f} | {tf / tb:.2f} | {rows * k * 2 / tb / 1e3:.0f} | "
                  f"{rows * k / tq / 1e3:.0f} | {same} |", flush=True)
            del wb, int8, wq, sc, blocks, bq, bs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
