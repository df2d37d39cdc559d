"""Before/after on CUDA in one run: the previous tree against this one (issue 12's speed rule).

The parent builds the random-weight models once (cuda_measure.build: Gemma-3-1B / -4B shapes,
saved to /dev/shm), then runs one child process per (tree, mode) on the same GPU, one after
another, each importing muser from its own tree:

    old        the tree before the change (exported to .old/: `git archive <rev> muser | tar -x -C .old`)
    exact      this tree, default (MUSER_CHUNKS=exact: chunks through the decode step's kernels)
    fast       this tree, MUSER_CHUNKS=fast (cuBLAS + FlashAttention chunks)

Each child measures batch-1 decode at 2k (and 32k) context (API ms/token and bare replay),
16 sessions at 2k (tokens/s), the same as greedy runs (`Engine.decode_greedy`: pipelined with
MUSER_PIPELINE=on; 1 session ms a step, 16 tokens/s), and prefill of 512 and 16k tokens
(tokens/s); `--chunks 2048,4096` adds the 16k prompt in chunks of those sizes (the same rows: a chunk of <= 2,048 rows is one graph replay), and
`--cpu-load N` the 16k prefill again with N processes spinning on the host's cores.

    PYTHONPATH=. python3 benchmarks/exact_ab.py --old .old [--models 1b,4b] [--rounds 1]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def busy(n: int):
    """n processes spinning on the host's cores while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]
    time.sleep(0.5)
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def parse_tiles(text: str) -> dict:
    """BENCH_DOT_TILES="2560x2048=32/512/4/3/0+2560x10240g=..." -> DOT_TILES entries: (n, k,
    glu) -> (block_n, block_k, warps, stages, piece); a trailing g on k marks act*up."""
    out = {}
    for item in filter(None, text.split("+")):
        shape, _, tile = item.partition("=")
        n, _, k = shape.partition("x")
        out[(int(n), int(k.rstrip("g")), k.endswith("g"))] = tuple(int(v) for v in tile.split("/"))
    return out


def child(args):
    import torch
    import muser
    from cuda_measure import muser_batch, muser_decode, muser_prefill, prefill_profile
    from cuda_bench import SHAPES
    shape = SHAPES[args.shape]
    if os.environ.get("BENCH_DOT_TILES"):     # a variant's decode tiles (this benchmark only)
        from muser.backends.cuda.triton_dot_tiles import DOT_TILES
        DOT_TILES.update(parse_tiles(os.environ["BENCH_DOT_TILES"]))
    eng = muser.load(args.path, device="cuda", dtype="bfloat16", progress=False,
                     max_context=args.max_context, quant=args.quant)
    vocab = shape["vocab"]
    out = {"tree": args.tree}
    t = time.perf_counter()
    out["decode_2k"] = muser_decode(eng, 2048, args.steps, vocab)[:2]
    if args.long and not (args.max_context and args.max_context < 32768 + 64):
        out["decode_32k"] = muser_decode(eng, 32768, args.steps, vocab)[:2]
    if args.shape in ("1b", "270m"):
        tps, _, bare = muser_batch(eng, 16, 2048, 16, vocab)[:3]
        out["batch16_2k"], out["batch16_bare_ms"] = tps, bare * 1e3
    if args.shape in ("1b", "270m") and hasattr(eng, "decode_greedy"):
        from cuda_measure import muser_greedy
        out["greedy_1_ms"] = muser_greedy(eng, 1, 2048, args.steps, vocab)[1]
        out["greedy_16"] = muser_greedy(eng, 16, 2048, args.steps, vocab)[0]
    out["prefill_512"] = max(muser_prefill(eng, 512, vocab, None, reps=3) for _ in range(2))
    no_16k = args.no_16k or bool(args.max_context and args.max_context < 16384 + 64)
    out["prefill_16k"] = muser_prefill(eng, 16384, vocab, None) if not no_16k else 0.0
    chunks = [int(c) for c in args.chunks.split(",") if c]   # the same rows (graphs <= 2k)
    for c in chunks:
        out[f"prefill_16k_c{c}"] = muser_prefill(eng, 16384, vocab, c)
    if args.cpu_load:                       # the host busy on N more processes (a build beside)
        with busy(args.cpu_load):
            out["prefill_16k_load"] = muser_prefill(eng, 16384, vocab, None)
            for c in chunks:
                out[f"prefill_16k_load_c{c}"] = muser_prefill(eng, 16384, vocab, c)
    if args.profile:                        # kernel time: a decode step at 2k, a 16k prefill
        out["profile_decode"] = muser_decode(eng, 2048, 8, vocab, prof=True)[2]
        if args.shape in ("1b", "270m"):    # where a 16-session step's time above one goes
            out["profile_b16"] = muser_batch(eng, 16, 2048, 8, vocab, prof=True)[3]
            if hasattr(eng, "decode_greedy"):   # and what a greedy step adds to the bare replay
                out["profile_greedy16"] = muser_greedy(eng, 16, 2048, 32, vocab, prof=True)[2]
        out["profile_16k"] = prefill_profile(eng, 16384, vocab)     # (kernel ms, wall ms, top)
    out["exact_rows"] = bool(getattr(eng, "exact_rows", False))
    out["seconds"] = round(time.perf_counter() - t, 1)
    torch.cuda.synchronize()
    print("RESULT " + json.dumps(out), flush=True)


def parent(args):
    import torch
    from cuda_bench import SHAPES
    from cuda_measure import build
    repo = os.path.dirname(HERE)
    trees = [("old", os.path.abspath(args.old), {}), ("exact", repo, {"MUSER_CHUNKS": "exact"}),
             ("fast", repo, {"MUSER_CHUNKS": "fast"})]
    # each child imports muser from its tree only (the rest of the path: site packages)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(":")
            if p and os.path.abspath(p) not in (repo, HERE)]
    trees = [t for t in trees if t[0] in args.trees.split(",")]
    for v in filter(None, args.variants.split(";")):          # NAME:VAR=VALUE,VAR=VALUE
        label, _, sets = v.partition(":")
        # a value may hold commas ("64,8"): a new VAR= starts at a comma before an upper-case name
        trees.append((label, repo, dict(kv.split("=", 1) for kv in re.split(r",(?=[A-Z_]+=)", sets))))
    rows = []
    for name in args.models.split(","):
        model, path = build(SHAPES[name], 32768 + 1024)
        del model
        torch.cuda.empty_cache()
        for rnd in range(args.rounds):
            for tree, root, env in trees:
                e = dict(os.environ, PYTHONPATH=":".join([root, HERE] + rest), **env)
                cmd = [sys.executable, __file__, "--child", "--tree", tree, "--path", path,
                       "--shape", name, "--steps", str(args.steps)] + (["--long"] if args.long else []) \
                    + (["--profile"] if args.profile else []) \
                    + ["--chunks", args.chunks, "--cpu-load", str(args.cpu_load)] \
                    + (["--max-context", env["MAX_CONTEXT"]] if "MAX_CONTEXT" in env else []) \
                    + ["--quant", env.get("QUANT", args.quant)] \
                    + (["--no-16k"] if args.decode_only or (args.no_16k and tree not in
                                                            ("old", "exact", "fast")) else [])
                t = time.perf_counter()
                p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=args.timeout)
                res = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
                if not res:
                    print(f"{name} {tree}: FAILED rc={p.returncode}\n{p.stderr[-3000:]}", flush=True)
                    continue
                r = json.loads(res[0][7:])
                r.update(model=name, round=rnd, wall=round(time.perf_counter() - t, 1))
                rows.append(r)
                print(json.dumps(r), flush=True)
    print("\n| model | tree | decode 2k ms (bare) | 32k ms | B16 tok/s (bare step ms) | greedy runs: "
          "B1 ms, B16 tok/s | prefill 512 tok/s | prefill 16k tok/s | exact rows |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d2, d32, b = r["decode_2k"], r.get("decode_32k"), r.get("batch16_2k")
        b16 = f"{b:,.0f} ({r.get('batch16_bare_ms', 0):.3f})" if b else "-"
        gr = (f"{r['greedy_1_ms']:.3f}, {r['greedy_16']:,.0f}" if "greedy_16" in r else "-")
        print(f"| {r['model']} | {r['tree']} | {d2[0] * 1e3:.3f} ({d2[1] * 1e3:.3f}) | "
              f"{f'{d32[0] * 1e3:.3f}' if d32 else '-'} | {b16} | {gr} | "
              f"{r['prefill_512']:,.0f} | {r['prefill_16k']:,.0f} | {r['exact_rows']} |")
    extra = sorted({k for r in rows for k in r if k.startswith("prefill_16k_")})
    if extra:                                   # --chunks / --cpu-load: the 16k prefill, tok/s
        print("\n| model | tree | " + " | ".join(extra) + " |")
        print("|---|---|" + "---|" * len(extra))
        for r in rows:
            print(f"| {r['model']} | {r['tree']} | "
                  + " | ".join(f"{r[k]:,.0f}" if k in r else "-" for k in extra) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--tree", default="exact")
    ap.add_argument("--path")
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--old", default=".old")
    ap.add_argument("--trees", default="old,exact,fast")
    ap.add_argument("--models", default="1b,4b")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--long", action="store_true", help="also decode at 32k")
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--json")
    ap.add_argument("--variants", default="", help="more runs of this tree: NAME:VAR=V,VAR=V;...")
    ap.add_argument("--profile", action="store_true", help="also print each run's top kernels")
    ap.add_argument("--no-16k", action="store_true", help="variants skip the 16k prefill")
    ap.add_argument("--decode-only", action="store_true", help="every tree skips the 16k prefill")
    ap.add_argument("--max-context", type=int, default=None,
                    help="the engine's max_context (a variant sets it with MAX_CONTEXT=N): a "
                         "growing plane's decode grid is its capacity over the split rows")
    ap.add_argument("--quant", default="none",    # (no muser import here: the trees have theirs)
                    choices=["none", "int8", "int8-head", "int8-head-fast"],
                    help="the engine's weights (a variant sets it with QUANT=int8: int8 rows)")
    ap.add_argument("--chunks", default="", help="also the 16k prefill in chunks of these sizes")
    ap.add_argument("--cpu-load", type=int, default=0,
                    help="also the 16k prefill (and --chunks) with N busy processes on the host")
    args = ap.parse_args()
    child(args) if args.child else parent(args)


if __name__ == "__main__":
    main()
