"""`dot_rows` decode tiles measured as a decode step runs them (CUDA): in a graph, as dependent
launches, each launch on its own copy of the weights so that they come from HBM, not the L2.

`cuda_gemv_sweep.py` (which chose DOT_TILES) times one launch over and over with
`do_bench`: a 2-4 MB matrix then sits in the 50 MB L2, and the launch gap is the stream's.
Here each shape gets enough copies to pass 256 MB, one graph replays a launch per copy with
programmatic dependent launch (MUSER_PDL's default), and the time per launch is what a step
pays.  Only speed fields vary (block_n, K step, warps, stages): the split-K piece stays the
shape's (`dot_config`'s -- it is the arithmetic), and every tile's output is checked bitwise
against the table's before it is timed.  `--pieces 1024,2048` also times other split-K pieces
(another arithmetic: those outputs are only checked close to the table's, and a piece that wins
here changes the shape's bits -- its cuts' encoding follows, backends/cuda `arithmetic_tag`).

    PYTHONPATH=. python3 benchmarks/dot_tiles_graph.py [270m] [1b] [4b] [--top 3] [--pieces ...]
    PYTHONPATH=. python3 benchmarks/dot_tiles_graph.py 270m 1b --batches 1 --l2   # HBM vs L2
    ncu --clock-control none --profile-from-start off --set full -o OUT/dot \
        python3 benchmarks/dot_tiles_graph.py 1b --batches 1 --profiled    # on the device
"""
import argparse
import itertools

import torch

# (n, k, glu) of each model's decode projections: qkv, o, gate|up, down
SHAPES = {"270m": [(1536, 640, False), (640, 1024, False), (2048, 640, True), (640, 2048, False)],
          "1b": [(1536, 1152, False), (1152, 1024, False), (6912, 1152, True), (1152, 6912, False)],
          "4b": [(4096, 2560, False), (2560, 2048, False), (10240, 2560, True),
                 (2560, 10240, False)]}
BYTES = 256 << 20


def per_launch_us(fn, copies: int) -> float:
    """One graph of `copies` launches (fn(i) launches on copy i), replayed: us per launch."""
    from decode_attn_probe import graph_us
    nxt = itertools.cycle(range(copies)).__next__      # each capture's launches: every copy once
    return graph_us(lambda: fn(nxt()), reps=copies, replays=10)


def candidates(piece: int):
    """Tiles to try: the speed fields only (the split-K piece is the arithmetic)."""
    for bn, bk, nw, st in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (2, 3, 4)):
        if piece and piece % bk:
            continue
        yield bn, bk, nw, st, piece


def _compile(job) -> None:
    """Compile one (shape, tile) in a worker: the binaries land in Triton's disk cache."""
    from muser.backends.cuda.triton_dot import dot_rows
    n, k, glu, cfg = job
    w = torch.zeros(2 * n if glu else n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)
    for pdl in (False, True):
        try:
            dot_rows(x, w, glu=glu, config=cfg, rows=16, pdl=pdl)
        except Exception:                               # noqa: BLE001 (the sweep skips it too)
            pass
    torch.cuda.synchronize()


def other_pieces(n: int, k: int, glu: bool, pieces) -> list[int]:
    """Of `pieces` (keys a split-K piece), those that split K evenly and are not the table's."""
    from muser.backends.cuda.triton_dot_tiles import dot_config
    own = dot_config(n, k, glu)[4]
    return [p for p in pieces if p < k and k % p == 0 and p != own]


def precompile(shapes, jobs: int, pieces=()) -> None:
    import multiprocessing as mp

    from muser.backends.cuda.triton_dot_tiles import dot_config
    work = [(n, k, glu, cfg) for n, k, glu in shapes
            for pc in [dot_config(n, k, glu)[4]] + other_pieces(n, k, glu, pieces)
            for cfg in candidates(pc)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        pool.map(_compile, work, chunksize=1)
    print(f"precompiled {len(work)} tiles on {jobs} processes", flush=True)


def operands(n: int, k: int, glu: bool, B: int, least: int = 8):
    """(copies, weights, x, outs) on the GPU in bf16: at least `least` copies of a random
    [n (x2 for gate|up), k] weight, enough to pass BYTES (so a graph over them reads HBM, not
    the L2), x [B, k] and an output [B, n] a copy."""
    dev = "cuda"
    rows = 2 * n if glu else n
    copies = max(least, -(-BYTES // (rows * k * 2)))
    ws = [(torch.randn(rows, k, device=dev) / k ** 0.5).to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(B, k, device=dev).to(torch.bfloat16)
    outs = [torch.empty(B, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    return copies, ws, x, outs


def sweep(n: int, k: int, glu: bool, B: int, top: int, piece: int | None = None) -> None:
    """The speed fields of the table's piece (bits checked equal), or of another `piece` (an
    arithmetic of its own: checked close)."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_dot_tiles import dot_config
    rows = 2 * n if glu else n
    copies, ws, x, outs = operands(n, k, glu, B)
    table = dot_config(n, k, glu)
    own = piece is None or piece == table[4]
    piece = table[4] if piece is None else piece
    want = dot_rows(x, ws[0], glu=glu, config=table, rows=16)
    results = []
    for cfg in candidates(piece):
        try:
            got = dot_rows(x, ws[0], glu=glu, config=cfg, rows=16)
            torch.cuda.synchronize()
        except Exception:                               # noqa: BLE001 (shared memory, etc.)
            continue
        same = torch.equal(got, want) if own else torch.allclose(got.float(), want.float(),
                                                                 rtol=2e-2, atol=2e-2)
        if not same:
            print(f"  {n}x{k}{' glu' if glu else ''} B{B} {cfg}: BITS DIFFER -- skipped",
                  flush=True)
            continue
        t = per_launch_us(lambda i: dot_rows(x, ws[i], outs[i], glu=glu, config=cfg, rows=16,
                                             pdl=True), copies)
        results.append((t, cfg))
    results.sort()
    t_table = next((t for t, c in results if c == table), float("nan"))
    floor = rows * k * 2 / 4.8e12 * 1e6
    best = ", ".join(f"{t:.2f} {c[:4]}" for t, c in results[:top])
    t_best = results[0][0] if results else float("nan")
    what = "table" if own else f"piece {piece} (other bits) vs table"
    print(f"{n}x{k}{' glu' if glu else ''} B{B}: {what} {table[:4]} {t_table:.2f} us | best {best} "
          f"| HBM floor {floor:.2f} us, best at {floor / t_best:.0%} ({copies} copies)", flush=True)


def profiled(shapes, batches) -> None:
    """Each shape's table tile, one launch a batch size on a weight copy not in the L2, inside
    the profiler's range (`ncu --profile-from-start off`)."""
    from muser.backends.cuda.triton_dot import dot_rows
    for n, k, glu in shapes:
        for B in batches:
            copies, ws, x, outs = operands(n, k, glu, B)
            dot_rows(x, ws[0], outs[0], glu=glu, rows=16)          # compiled outside the range
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            mid = copies // 2               # written >= 128 MB before: not in the L2
            dot_rows(x, ws[mid], outs[mid], glu=glu, rows=16)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"profiled {n}x{k}{' glu' if glu else ''} B{B}", flush=True)
            del ws, outs


def l2_ceiling(shapes, batches) -> None:
    """Each shape's table tile per launch in a graph with its weights from HBM (a copy a
    launch) and from the L2 (one copy, every launch): what a launch can gain at most when a
    prefetch has brought all its weights in (MUSER_PREFETCH, l2_prefetch.py).  A weight past
    the L2's share it keeps (the 1B's 32 MB gate|up) is only partly L2-resident here."""
    from muser.backends.cuda.triton_dot import dot_rows
    for n, k, glu in shapes:
        for B in batches:
            copies, ws, x, outs = operands(n, k, glu, B)
            cold = per_launch_us(lambda i: dot_rows(x, ws[i], outs[i], glu=glu, rows=16,
                                                    pdl=True), copies)
            hot = per_launch_us(lambda i: dot_rows(x, ws[0], outs[i], glu=glu, rows=16,
                                                   pdl=True), copies)
            mb = (2 * n if glu else n) * k * 2 / 2 ** 20
            print(f"{n}x{k}{' glu' if glu else ''} B{B} ({mb:.1f} MB): HBM {cold:.2f} us, "
                  f"L2 {hot:.2f} us a launch (-{cold - hot:.2f})", flush=True)
            del ws, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["270m", "1b"])
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--jobs", type=int, default=12, help="processes compiling the tiles first")
    ap.add_argument("--pieces", default="", help="also these split-K pieces (keys a piece; "
                    "another arithmetic) where they divide K and differ from the table's")
    ap.add_argument("--profiled", action="store_true",
                    help="no sweep: each shape's table tile once (weights from HBM, PDL off) "
                         "inside cudaProfilerStart / Stop, for Nsight Compute")
    ap.add_argument("--l2", action="store_true",
                    help="no sweep: each shape's table tile per launch with its weights from "
                         "HBM and from the L2 (the ceiling of a prefetch)")
    args = ap.parse_args()
    shapes = [s for m in args.models for s in SHAPES[m]]
    batches = [int(b) for b in args.batches.split(",")]
    if args.l2:
        l2_ceiling(shapes, batches)
        return
    if args.profiled:
        profiled(shapes, batches)
        return
    pieces = [int(p) for p in args.pieces.split(",") if p]
    if args.jobs > 1:
        precompile(shapes, args.jobs, pieces)
    for n, k, glu in shapes:
        for B in batches:
            sweep(n, k, glu, B, args.top)
            for pc in other_pieces(n, k, glu, pieces):
                sweep(n, k, glu, B, args.top, pc)


if __name__ == "__main__":
    main()
