"""The 16k prefill, the tree before a change against this one, with the bits compared (CUDA).

For a change meant to keep every bit (a kernel's loop nest, a launch moved): the parent builds
the random-weight model once (cuda_measure.build), then runs one child a (tree, round) in the
order A B B A ..., each importing muser from its own tree.  A child warms one 16k prefill,
times `--reps` more (best and median tok/s), and saves the last prompt's final logits and one
sliding and one full layer's K rows; the parent then says whether every tree's are
`torch.equal` to the first's -- a neutral change shows equal bits and equal speed.

    PYTHONPATH=benchmarks python3 benchmarks/prefill_tree_ab.py --old .prev [--models 1b,270m]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(args):
    import torch
    import muser
    from cuda_bench import SHAPES
    from cuda_measure import rand_ids, reserve, sync
    shape = SHAPES[args.shape]
    eng = muser.load(args.path, device="cuda", dtype="bfloat16", progress=False)
    ids = rand_ids(args.n, shape["vocab"], 7)
    times, logits, s = [], None, None
    for r in range(args.reps + 1):
        s = eng.new_session()
        reserve(s, args.n)
        sync()
        t0 = time.perf_counter()
        logits = s.prefill(ids)
        sync()
        if r:
            times.append(time.perf_counter() - t0)
    kinds = {p.kind: i for i, p in enumerate(s.planes)}          # one plane of each kind
    rows = {k: s.planes[i].logical_rows()[0].float().cpu() for k, i in kinds.items()}
    torch.save({"logits": logits.float().cpu(), **rows}, args.save)
    print("RESULT " + json.dumps({"best": args.n / min(times),
                                  "median": args.n / statistics.median(times)}), flush=True)


def parent(args):
    import torch
    from cuda_bench import SHAPES
    from cuda_measure import build
    repo = os.path.dirname(HERE)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(":")
            if p and os.path.abspath(p) not in (repo, HERE)]
    trees = [("old", os.path.abspath(args.old)), ("new", repo)]
    order = [t for rnd in range(args.rounds) for t in (trees if rnd % 2 == 0 else trees[::-1])]
    for name in args.models.split(","):
        model, path = build(SHAPES[name], args.n + 1024)
        del model
        torch.cuda.empty_cache()
        got = {t: [] for t, _ in trees}
        saved = {}
        for tree, root in order:
            env = dict(os.environ, PYTHONPATH=":".join([root, HERE] + rest))
            save = f"/tmp/tree-ab-{name}-{tree}.pt"
            cmd = [sys.executable, __file__, "--child", "--path", path, "--shape", name,
                   "--n", str(args.n), "--reps", str(args.reps), "--save", save]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            res = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if not res:
                print(f"{name} {tree}: FAILED rc={p.returncode}\n{p.stderr[-3000:]}", flush=True)
                continue
            got[tree].append(json.loads(res[0][7:]))
            saved[tree] = torch.load(save)
            print(f"{name} {tree}: {got[tree][-1]}", flush=True)
        if len(saved) == len(trees):
            base = saved[trees[0][0]]
            for tree, _ in trees[1:]:
                eq = {k: torch.equal(base[k], saved[tree][k]) for k in base}
                print(f"{name} bits {trees[0][0]} == {tree}: {eq}", flush=True)
                if not all(eq.values()):      # an arithmetic change: how far, not only whether
                    gap = {k: float((base[k].float() - saved[tree][k].float()).abs().max())
                           for k in base}
                    print(f"{name} max |old - new|: {gap}", flush=True)
        for tree, _ in trees:
            if got[tree]:
                print(f"| {name} | {tree} | " + ", ".join(f"{g['best']:,.0f}" for g in got[tree])
                      + " | " + ", ".join(f"{g['median']:,.0f}" for g in got[tree]) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--path")
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--save")
    ap.add_argument("--old", default=".prev")
    ap.add_argument("--models", default="1b")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    (child if args.child else parent)(args)


if __name__ == "__main__":
    main()
