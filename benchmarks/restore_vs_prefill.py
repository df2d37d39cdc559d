"""Restore-then-first-token vs cold prefill of the same context on the embedded model.

For each context N: cold = prefill N tokens in a fresh session and decode one token;
restore = load the session pack saved from that prefill (from disk, digests checked),
install it into a fresh session and decode the same token.  Same mode for both
(the CPU default unless --dtype/--quant say otherwise).

    python benchmarks/restore_vs_prefill.py --contexts 2048 8192 32000   (32,768 is the whole context: no room for the token)
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

import muser
from muser.pack import format as pf
from muser.pack import reader as pr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32000])
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--quant", default=None)
    args = ap.parse_args()
    engine = muser.load("gemma3-270m", dtype=args.dtype, quant=args.quant, progress=False)
    text = "A hybrid cache keeps sliding windows in rings and full history in growing planes. " * 3000
    ids = engine.tokenizer.encode(text)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in args.contexts:
            s = engine.new_session()
            t0 = time.perf_counter()
            s.prefill(ids[:n], chunk_size=512)
            cold_first = s.decode(1000)
            cold = time.perf_counter() - t0
            path = os.path.join(d, f"s{n}.pack")
            s2 = engine.new_session()
            s2.prefill(ids[:n], chunk_size=512)
            pf.save_pack(s2.snapshot(), path)
            size = os.path.getsize(path)
            t0 = time.perf_counter()
            r = engine.restore(pr.load_pack(path))
            warm_first = r.decode(1000)
            warm = time.perf_counter() - t0
            assert torch.equal(cold_first, warm_first), "restored first token differs from the live session"
            rows.append((n, cold, warm, size))
            print(f"context {n:6d}: cold prefill + first token {cold:7.2f} s, restore + first token "
                  f"{warm:6.3f} s ({cold / warm:6.1f}x), pack {size / 2**20:.1f} MiB", flush=True)
    print("\n| context | cold prefill + 1st token (s) | load pack + restore + 1st token (s) | speedup | pack MiB |")
    print("|---|---:|---:|---:|---:|")
    for n, c, w, size in rows:
        print(f"| {n:,} | {c:.2f} | {w:.3f} | {c / w:.1f}x | {size / 2**20:.1f} |")


if __name__ == "__main__":
    main()
