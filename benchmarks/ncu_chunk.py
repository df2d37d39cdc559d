"""One global layer's 16k chunk attention under Nsight Compute: where the exact kernel stalls.

Issue 12's last CUDA rule is the 1B's 16k prefill; its one lever that is ours alone is the four
global layers' exact chunk attention (3.75 ms each on the H200, thirtieth session), which a plain
flash attention over the same 32-key tiles runs in ~1.3 ms (fa_ceiling.py).  The kernel-level
probes so far (pairs of tiles, value-column slices, parked splits, groups a program) each moved
it the wrong way; this asks the hardware instead: the exact kernel (the engine's default route,
eager) and fa_ceiling's plain kernel (BM 64, BN 32, 4 warps), one launch each inside a profiler
range, on the Gemma-3-1B geometry (4 heads, 1 KV head, D 256, causal, 16,384 rows).

    PYTHONPATH=. python3 benchmarks/ncu_chunk.py                     # times only, no profiler
    ncu --clock-control none --profile-from-start off --set full --import-source yes \\
        -o OUT/chunk python3 benchmarks/ncu_chunk.py --profiled        # on the device

`device_plan.sh ncu` runs the second and prints the reports' details and stall pages (text);
`--window 512` profiles a sliding layer's chunk instead (the 1B's 22 rings: 0.32 ms each at 16k
against FlashAttention's 0.15, thirty-second session; not yet run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from fa_ceiling import D, H, KV, SCALE, timed, triton_fa  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--window", type=int, default=0,
                    help="a sliding layer instead (the 1B's: 512): the exact kernel's eager route "
                         "over the ordered view, alone (the plain kernel has no window)")
    ap.add_argument("--profiled", action="store_true",
                    help="run each kernel once more inside cudaProfilerStart / Stop (for ncu)")
    a = ap.parse_args()
    from muser.backends.cuda.triton_attn import layout
    from muser.backends.cuda.triton_chunk import chunk_attention
    from muser.env import read

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(a.rows, H, D, device=dev, dtype=dt)
    k = torch.randn(a.rows, KV, D, device=dev, dtype=dt)
    v = torch.randn(a.rows, KV, D, device=dev, dtype=dt)
    window = a.window or None
    lay = layout(window is None, D, read())      # the chunk knobs as the environment sets them
    runs = {f"exact chunk (default route{f', window {window}' if window else ''})":
            lambda: chunk_attention(q, k, v, 0, 0, window, SCALE, None, False, lay)}
    if window is None:
        runs["plain flash, BM 64 BN 32 4 warps"] = lambda: triton_fa(q, k, v, 64, 32, 4, 2)
    for name, fn in runs.items():                    # compile, then time outside the profiler
        fn()
        print(f"{name}: {timed(fn, 5):.3f} ms", flush=True)
    if a.profiled:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for fn in runs.values():
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
