"""Decode-only figures on CUDA for an A/B of two trees in one device call (random weights at
real shapes): batch-1 ms/token at 2k (API and bare replay) and batch-B tok/s at 2k, per shape,
plus the embedded 270M GGUF at batch 1 and 16.  Run it once per tree, in the same call:

    PYTHONPATH=OLD_TREE python3 benchmarks/cuda_decode_ab.py --tag old
    PYTHONPATH=.        python3 benchmarks/cuda_decode_ab.py --tag new
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from cuda_bench import SHAPES                                   # noqa: E402
from cuda_measure import build, muser_batch, muser_decode      # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="run")
    ap.add_argument("--models", default="1b,4b")
    ap.add_argument("--batches", default="16")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import muser
    rows = {}
    for name in args.models.split(","):
        if name == "270m":
            engine, vocab = muser.load("gemma3-270m", device="cuda", dtype="bfloat16", progress=False), 262144
        else:
            shape = SHAPES[name]
            _, path = build(shape, 4096)
            engine, vocab = muser.load(path, device="cuda", dtype="bfloat16", progress=False), shape["vocab"]
        api, bare = muser_decode(engine, 2048, args.steps, vocab)[:2]
        r = rows[name] = {"b1_api_ms": api * 1e3, "b1_bare_ms": bare * 1e3}
        for b in (int(x) for x in args.batches.split(",")):
            tps, step, bare_b = muser_batch(engine, b, 2048, 32, vocab)[:3]
            r[f"b{b}_tok_s"], r[f"b{b}_bare_ms"] = tps, bare_b * 1e3
        print(f"[{args.tag}] {name} " + " ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
        del engine
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, f"decode_ab_{args.tag}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
