"""What Triton can reach on a global layer's 16k prefill attention, and what the key tile costs.

Issue 12's last rule is the CUDA 16k prefill; its gap is the exact chunk attention of the four
global layers (1B: 6.8 ms each, FlashAttention-2 ~2.3).  Before another arithmetic change this
asks two things on the Gemma-3-1B geometry (4 heads, 1 KV head, D 256, causal, 16,384 rows):

1. The ceiling: a plain (not batch-invariant) Triton flash-attention forward written here --
   one program per (BM query rows, head), an unmasked key loop then the diagonal tiles -- over
   key tiles of 32 / 64 / 128, against FlashAttention-2 (torch's `_flash_attention_forward`).
   If 32-key tiles cost ~2x what 128-key ones do even there, the decode step's 32-key tile (the
   arithmetic both kernels share) is the lever; if Triton's best is far from FA-2, it is not.
2. The exact chunk kernel on the same inputs: the default layout (growing splits of 128 keys,
   nested loop), other key tiles and splits, and triton_chunk_lean.py (the default layout's
   bits with the group's and total's state in memory: one register accumulator, 4 warps),
   checked torch.equal against the default.

Every Triton variant is checked against FlashAttention-2 (max |diff| printed; bf16 output).

    PYTHONPATH=. python3 benchmarks/fa_ceiling.py [--rows 16384] [--reps 5] [--parts fa,lean,exact]
"""
from __future__ import annotations

import argparse
import functools

import torch

H, KV, D = 4, 1, 256
SCALE = 0.0625
# (BM query rows, BN keys, warps, stages): D = 256 leaves few registers; some may not compile
CONFIGS = [(64, 32, 4, 2), (64, 32, 8, 2), (64, 64, 4, 2), (64, 64, 8, 2), (64, 64, 8, 3),
           (64, 128, 8, 2), (128, 32, 8, 2), (128, 64, 8, 2), (128, 128, 8, 2)]

# the exact chunk kernel's layouts (triton_attn.layout fields over the growing default)
EXACT = [("exact chunk, default (32-key tiles, 128-key splits, nested)", {}),
         ("exact chunk, GR32F (32-key tiles and splits, flat)", {"split": 32, "chunk_loop": "flat"}),
         ("exact chunk, 64-key tiles and splits, flat", {"block_n": 64, "split": 64,
                                                         "chunk_loop": "flat"}),
         ("exact chunk, 64-key tiles, 128-key splits, nested", {"block_n": 64, "split": 128}),
         ("exact chunk, 128-key tiles and splits, flat", {"block_n": 128, "split": 128,
                                                          "chunk_loop": "flat"})]

# triton_chunk_lean.py on the default layout: (query slots a program, warps)
LEAN = [(64, 4), (64, 8), (32, 4), (128, 8)]


@functools.lru_cache(maxsize=None)
def _fa():
    import triton
    import triton.language as tl

    @triton.jit
    def fa_kernel(Q, K, V, O, N, qk_scale, H: tl.constexpr, KVH: tl.constexpr,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        # heavy tiles (late rows: more keys) first
        t = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
        kvh = h // (H // KVH)
        rows = t * BM + tl.arange(0, BM)                     # [BM]
        d = tl.arange(0, D)
        live = rows < N
        q = tl.load(Q + (rows[:, None].to(tl.int64) * H + h) * D + d[None, :],
                    mask=live[:, None], other=0.0)           # [BM, D]
        m = tl.full([BM], float("-inf"), tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        hi = tl.minimum(t * BM + BM, N)
        whole = (t * BM) // BN * BN                          # keys every row sees: [0, whole)
        for st in range(0, whole, BN):
            kk = st + tl.arange(0, BN)
            off = (kk[:, None].to(tl.int64) * KVH + kvh) * D + d[None, :]
            k = tl.load(K + off)
            s = tl.dot(q, tl.trans(k)) * qk_scale             # [BM, BN], log2 units
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m - m_new)
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + off)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m = m_new
        for st in range(whole, hi, BN):                      # the diagonal: masked
            kk = st + tl.arange(0, BN)
            off = (kk[:, None].to(tl.int64) * KVH + kvh) * D + d[None, :]
            ok = kk < N
            k = tl.load(K + off, mask=ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(kk[None, :] <= rows[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m - m_new)
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + off, mask=ok[:, None], other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m = m_new
        tl.store(O + (rows[:, None].to(tl.int64) * H + h) * D + d[None, :],
                 (acc / l[:, None]).to(O.dtype.element_ty), mask=live[:, None])

    return fa_kernel


def triton_fa(q, k, v, bm, bn, warps, stages):
    n = q.shape[0]
    out = torch.empty_like(q)
    _fa()[(-(-n // bm), H)](q, k, v, out, n, SCALE * 1.4426950408889634, H=H, KVH=KV, D=D,
                            BM=bm, BN=bn, num_warps=warps, num_stages=stages)
    return out


def flash(q, k, v):
    n = q.shape[0]
    return torch.ops.aten._flash_attention_forward(q[None], k[None], v[None], None, None, n, n,
                                                    0.0, True, False, scale=SCALE)[0][0]


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)[reps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--parts", default="fa,lean,exact",
                    help="which rows besides FA-2: fa (plain Triton), lean, exact (layouts)")
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(a.rows, H, D, device=dev, dtype=dt)
    k = torch.randn(a.rows, KV, D, device=dev, dtype=dt)
    v = torch.randn(a.rows, KV, D, device=dev, dtype=dt)
    ref = flash(q, k, v)
    flops = 4 * a.rows * a.rows / 2 * H * D
    ms = timed(lambda: flash(q, k, v), a.reps)
    print(f"| variant | ms | TFLOP/s | max diff vs FA-2 |\n|---|---:|---:|---:|")
    print(f"| FlashAttention-2 | {ms:.2f} | {flops / ms / 1e9:.0f} | 0 |", flush=True)
    parts = set(a.parts.split(","))
    for bm, bn, warps, stages in CONFIGS if "fa" in parts else ():
        name = f"Triton FA BM {bm} BN {bn} warps {warps} stages {stages}"
        try:
            out = triton_fa(q, k, v, bm, bn, warps, stages)
            diff = (out.float() - ref.float()).abs().max().item()
            ms = timed(lambda: triton_fa(q, k, v, bm, bn, warps, stages), a.reps)
            print(f"| {name} | {ms:.2f} | {flops / ms / 1e9:.0f} | {diff:.3g} |", flush=True)
        except Exception as e:                                          # noqa: BLE001
            print(f"| {name} | failed: {type(e).__name__} {str(e)[:120]} | | |", flush=True)
    from muser.backends.cuda.triton_attn import layout
    from muser.backends.cuda.triton_chunk import chunk_attention
    base = layout(True, D)
    exact = chunk_attention(q, k, v, 0, 0, None, SCALE, None, False, base)
    from muser.backends.cuda.triton_chunk_lean import lean_attention
    for bm, warps in LEAN if "lean" in parts else ():
        name = f"lean chunk (state in memory), BM {bm} warps {warps}"
        fn = lambda: lean_attention(q, k, v, 0, 0, SCALE, None, False, base,  # noqa: E731
                                    block_m=bm, warps=warps)
        try:
            out = fn()
            ms = timed(fn, a.reps)
            print(f"| {name} | {ms:.2f} | {flops / ms / 1e9:.0f} | equal to the exact "
                  f"default: {torch.equal(out, exact)} |", flush=True)
        except Exception as e:                                          # noqa: BLE001
            print(f"| {name} | failed: {type(e).__name__} {str(e)[:120]} | | |", flush=True)
    for name, over in EXACT if "exact" in parts else EXACT[:1]:
        lay = {**base, **over}
        fn = lambda: chunk_attention(q, k, v, 0, 0, None, SCALE, None, False, lay)  # noqa: E731
        try:
            out = fn()
            diff = (out.float() - ref.float()).abs().max().item()
            ms = timed(fn, a.reps)
            print(f"| {name} | {ms:.2f} | {flops / ms / 1e9:.0f} | {diff:.3g} |", flush=True)
        except Exception as e:                                          # noqa: BLE001
            print(f"| {name} | failed: {type(e).__name__} {str(e)[:120]} | | |", flush=True)


if __name__ == "__main__":
    main()
