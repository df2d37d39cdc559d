"""A short A/B of MUSER_DOT_TMA on the 16k prefill (CUDA): two engines on the same random
weights, one with the pointer tiles and one with the TMA tiles, alternating; the last logits
and every K/V row of a 16k prompt compared bitwise; then each one's kernel time by kernel.

    PYTHONPATH=.:benchmarks python3 benchmarks/prefill_tma_ab.py [--models 1b] [--rounds 2]
"""
import argparse
import os

import torch

from cuda_bench import SHAPES
from cuda_measure import build, muser_prefill, prefill_profile, rand_ids, reserve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1b")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import muser
    for name in args.models.split(","):
        shape = SHAPES[name]
        _, path = build(shape, 16384 + 1024)       # the weights on disk; the HF model dropped
        engines = {}
        for mode in ("off", "on"):
            os.environ["MUSER_DOT_TMA"] = mode          # read once, at load
            engines[mode] = muser.load(path, device="cuda", dtype="bfloat16", progress=False,
                                       max_context=16384 + 1024)
        ids = rand_ids(16384, shape["vocab"], 5)
        outs = {}
        for mode, eng in engines.items():
            s = eng.new_session()
            reserve(s, 16384)
            outs[mode] = (s.prefill(ids), s.snapshot())
        same = torch.equal(outs["off"][0], outs["on"][0]) and outs["off"][1].equal(outs["on"][1])
        print(f"{name}: 16k prefill, TMA on == off (logits, every K/V row): {same}", flush=True)
        for r in range(args.rounds):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                tps = muser_prefill(engines[mode], 16384, shape["vocab"], None)
                print(f"{name} round {r + 1} TMA {mode}: 16k prefill {tps:,.0f} tok/s", flush=True)
        for mode, eng in engines.items():
            kernel_ms, wall_ms, top = prefill_profile(eng, 16384, shape["vocab"])
            tops = ", ".join(f"{k[:28]} {ms:.1f}" for k, _, ms in top[:5])
            print(f"{name} TMA {mode}: kernels {kernel_ms:.1f} ms, wall {wall_ms:.1f} ms | {tops}",
                  flush=True)


if __name__ == "__main__":
    main()
