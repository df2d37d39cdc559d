"""Which chunk-attention tiles give a row the decode step's bits, and what they cost (CUDA).

Part 1 runs tests/cuda/test_triton_chunk.py's decode-vs-chunk case with several query-slot
counts per tile and prints the rows (and their slot in the tile) whose bits differ.  Part 2
times chunk_attention at the Gemma-3-1B shape (4 heads, 1 KV head, D 256): a 16k prefill's
global layer in 4k-row chunks and a sliding layer (window 512), against FlashAttention-2.

    PYTHONPATH=.:tests/cuda python3 benchmarks/chunk_attn_probe.py
"""
import sys
import time

import torch

import test_triton_chunk as T


def part1():
    dev, dt = "cuda", torch.bfloat16
    for kind in ("ring", "growing"):
        for heads, kv, d, qkn in ((4, 2, 32, True), (4, 1, 256, False)):
            lay = T._layout(kind, d, 32 if d >= 256 else 16)
            ins = T._inputs(heads, kv, d, dt, dev, qkn)
            ref, rp, nsplit, cap = T._decode(kind, heads, kv, d, dt, dev, lay, *ins, d ** -0.5, None)
            G = heads // kv
            for bm, warps in ((G, None), (16, None), (64, None), (64, 8), (128, 8)):
                out, plane, routes = T._chunks(kind, [150], heads, kv, d, dt, dev, lay, nsplit, cap,
                                               *ins, d ** -0.5, None, bm, warps)
                diff = (out.float() - ref.float()).abs().amax(dim=(1, 2))
                bad = (diff > 0).nonzero().flatten().tolist()
                rows = max(1, bm // G)
                print(f"{kind} G={G} D={d} block_m={bm} warps={warps}: {len(bad)} rows differ: "
                      f"{bad[:12]} slots {sorted(set(r % rows for r in bad))[:12]}", flush=True)


def part2():
    from muser.backends.cuda.triton_attn import layout
    from muser.backends.cuda.triton_chunk import chunk_attention
    dev, dt = "cuda", torch.bfloat16
    H, KV, D, N = 4, 1, 256, 16384
    k = torch.randn(N, KV, D, device=dev, dtype=dt)
    v = torch.randn(N, KV, D, device=dev, dtype=dt)
    q = torch.randn(N, H, D, device=dev, dtype=dt)
    for growing, window in ((True, None), (False, 512)):
        lay = layout(growing, D)
        for bm, warps in ((16, 4), (64, 4), (64, 8), (128, 8), (128, 4)):
            times = []
            for rep in range(2):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for a in range(0, N, 4096):
                    chunk_attention(q[a:a + 4096], k[:a + 4096], v[:a + 4096], a, 0, window, 0.0625,
                                    None, False, lay, block_m=bm, warps=warps)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            print(f"chunk_attention growing={growing} block_m={bm} warps={warps}: {times[1] * 1e3:.2f} ms "
                  f"(first {times[0] * 1e3:.0f} ms)", flush=True)
        t = time.perf_counter()
        for rep in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for a in range(0, N, 4096):
                torch.ops.aten._flash_attention_forward(
                    q[None, a:a + 4096], k[None, :a + 4096], v[None, :a + 4096], None, None, 4096,
                    a + 4096, 0.0, True, False, scale=0.0625,
                    window_size_left=(window - 1) if window else -1, window_size_right=0)
            torch.cuda.synchronize()
        print(f"flash growing={growing}: {(time.perf_counter() - t) * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    part1() if "2" not in sys.argv[1:] else None
    part2() if "1" not in sys.argv[1:] else None
