"""A short A/B of a knob on the 16k prefill (CUDA; MUSER_DOT_TMA unless --knob): engines on
the same random weights, one a mode of the knob each, alternating; the last logits and every K/V
row of a 16k prompt compared bitwise against the first mode's; then each one's kernel time by
kernel, and the chunk attention's milliseconds layer by layer (the first engine's).

    PYTHONPATH=.:benchmarks python3 benchmarks/prefill_tma_ab.py [--models 1b] [--rounds 2]
        [--knob MUSER_DOT_TMA] [--modes off,on] [--chunk 2048] [--top 5]
"""
import argparse
import os

import torch

from cuda_bench import SHAPES
from cuda_measure import (build, muser_prefill, prefill_profile, prefill_sequence, rand_ids,
                          reserve)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--knob", default="MUSER_DOT_TMA", help="the MUSER_* knob the modes set")
    ap.add_argument("--modes", default="off,on", help="the knob's modes, the first the base")
    ap.add_argument("--chunk", type=int, default=None, help="the prompt in chunks of this size")
    ap.add_argument("--top", type=int, default=5, help="kernels listed a mode, by time")
    args = ap.parse_args()
    modes = args.modes.split(",")
    import muser
    for name in args.models.split(","):
        shape = SHAPES[name]
        _, path = build(shape, 16384 + 1024)       # the weights on disk; the HF model dropped
        engines = {}
        for mode in modes:
            os.environ[args.knob] = mode                # read once, at load
            engines[mode] = muser.load(path, device="cuda", dtype="bfloat16", progress=False,
                                       max_context=16384 + 1024)
        ids = rand_ids(16384, shape["vocab"], 5)
        outs = {}
        for mode, eng in engines.items():
            s = eng.new_session()
            reserve(s, 16384)
            outs[mode] = (s.prefill(ids, chunk_size=args.chunk), s.snapshot())
        base = outs[modes[0]]
        for mode in modes[1:]:
            same = torch.equal(base[0], outs[mode][0]) and base[1].equal(outs[mode][1])
            print(f"{name}: 16k prefill, {args.knob} {mode} == {modes[0]} (logits, every K/V row): "
                  f"{same}", flush=True)
        for r in range(args.rounds):                   # A B B A: each round reverses the order
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                tps = muser_prefill(engines[mode], 16384, shape["vocab"], args.chunk)
                print(f"{name} round {r + 1} {args.knob} {mode}: 16k prefill {tps:,.0f} tok/s",
                      flush=True)
        for mode, eng in engines.items():
            kernel_ms, wall_ms, top = prefill_profile(eng, 16384, shape["vocab"], args.chunk)
            tops = ", ".join(f"{k[:28]} {ms:.1f}" for k, _, ms in top[:args.top])
            print(f"{name} {args.knob} {mode}: kernels {kernel_ms:.1f} ms, wall {wall_ms:.1f} ms | {tops}",
                  flush=True)
        for mode in modes:
            seq = prefill_sequence(engines[mode], 16384, shape["vocab"], "chunk_kernel",
                                   args.chunk)
            print(f"{name} {mode}: chunk attention by layer, ms ({len(seq)} launches, "
                  f"{sum(seq):.1f}): " + " ".join(f"{t:.2f}" for t in seq), flush=True)


if __name__ == "__main__":
    main()
