"""What CUDA's default pays at load to decide whether a head is Q8_0 (defaults.default_head ->
weights_int8.exact_blocks): a head that is not (the sample's search, then refused) and one that
is (the sample, the whole head's search, every row compared), at the 270M's / 1B's / 4B's head
shapes (262,144 rows of 640 / 1,152 / 2,560), bf16.

    PYTHONPATH=. python3 benchmarks/head_blocks_cost.py [--device cuda] [--shapes 640,1152,2560]
"""
import argparse
import time

import torch

from muser.backends.cuda.weights_int8 import exact_blocks
from muser.testing import q8_0_values


def timed(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="640,1152,2560")
    ap.add_argument("--rows", type=int, default=262144)
    a = ap.parse_args()
    print(f"| head (bf16, {a.device}) | not Q8_0: refused, s | Q8_0: found, s |")
    print("|---|---:|---:|")
    for cols in (int(c) for c in a.shapes.split(",")):
        rnd = (torch.randn(a.rows, cols, device=a.device) * 0.05).to(torch.bfloat16)
        t_no, no = timed(lambda r=rnd: exact_blocks(r), a.device)
        del rnd
        q8 = q8_0_values(torch.randn(a.rows, cols, device=a.device) * 0.05, torch.bfloat16)
        t_yes, yes = timed(lambda: exact_blocks(q8), a.device)
        assert no is None and yes is not None, (no, yes)
        print(f"| {a.rows} x {cols} | {t_no:.3f} | {t_yes:.3f} |")


if __name__ == "__main__":
    main()
