"""Where a decode step's attention time goes (CUDA): one layer's launch, timed alone.

The Gemma-3-1B geometry (4 heads, 1 KV head, D 256; ring window 512, growing plane): a plane
filled to `context` positions, then the decode launch for the next position, captured 20 times
in a CUDA graph and replayed (us per launch).  Variants override triton_attn.layout's fields
(split, group, depth, block_n, warps); `q-given` runs decode_attention on a prepared q (no
norm / RoPE / store / reload prologue) -- the prologue's cost is the difference.

    PYTHONPATH=. python3 benchmarks/decode_attn_probe.py [context ...] [qk] [NAME:KEY=INT,...]
    ncu --clock-control none --profile-from-start off --set full -o OUT/decode \
        python3 benchmarks/decode_attn_probe.py 2048 qk --profiled       # on the device

`--profiled`: after the times, the default layout's fused launch once more (each kind and
context) inside cudaProfilerStart / Stop, outside any graph, for Nsight Compute.

A `NAME:KEY=INT,...` argument (e.g. `bn64w8:block_n=64,warps=8`) replaces the built-in variants
with the ones given (the default layout always runs first).
"""
import sys

import torch

from muser.backends.cuda import triton_decode as td
from muser.backends.cuda.triton_attn import layout
from muser.cache.growing import GrowingPlane
from muser.cache.many import advance_lockstep
from muser.cache.ring import RingPlane
from muser.model import ops

H, KV, D = 4, 1, 256
VARIANTS = [("default", {}), ("masks everywhere", {"interior": False}),
            ("acc add", {"acc_dot": False}), ("masks, acc add", {"interior": False, "acc_dot": False}),
            ("depth 1", {"depth": 1}), ("warps 2", {"warps": 2}), ("split 64", {"split": 64})]


def graph_us(fn, reps=20, replays=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(replays):
        g.replay()
    ev[1].record()
    torch.cuda.synchronize()
    return ev[0].elapsed_time(ev[1]) * 1e3 / reps / replays


def variants(args: list[str]) -> list[tuple[str, dict]]:
    """The layouts to time: the built-in list, or `default` and the NAME:KEY=INT,... args."""
    given = [a for a in args if ":" in a]
    if not given:
        return VARIANTS
    out = [("default", {})]
    for a in given:
        name, spec = a.split(":", 1)
        out.append((name, {k: int(v) for k, v in (kv.split("=") for kv in spec.split(","))}))
    return out


def main():
    dev, dt = "cuda", torch.bfloat16
    contexts = [int(a) for a in sys.argv[1:] if a.isdigit()] or [2048, 32768]
    cos, sin = ops.rope_tables(10000.0, 1.0, D, dev, 65536)
    qkv = torch.randn(1, (H + 2 * KV) * D, device=dev).to(dt)
    qkn = "qk" in sys.argv[1:]                    # Gemma 3's q/k norms in the fused prologue
    qn = kn = (torch.rand(D, device=dev) + 0.5) if qkn else None
    for kind in ("ring", "growing"):
        for ctx in contexts:
            if kind == "ring" and ctx != contexts[0]:
                continue
            plane = (RingPlane(0, 512, 65536, KV, D, dt, dev) if kind == "ring"
                     else GrowingPlane(0, 65536, KV, D, dt, dev))
            if kind == "growing":
                plane.reserve(ctx + 1)
            advance_lockstep([plane], ctx)
            plane.keys.normal_()
            plane.values.normal_()
            slot, n = advance_lockstep([plane], 1)
            cap = plane.capacity if kind == "ring" else 0
            table = torch.tensor([td.plane_row(plane)], dtype=torch.int64, device=dev)
            meta = torch.tensor([[slot, n]], dtype=torch.int64, device=dev)
            pos = torch.tensor([ctx], dtype=torch.int64, device=dev)
            out = torch.empty(1, H, D, device=dev, dtype=dt)
            for name, over in variants(sys.argv[1:]):
                lay = {**layout(kind == "growing", D), **over}
                # whole tiles a split, as layout() rounds (a ring's 32 under a 64-key tile: 64)
                lay["split"] = max(lay["block_n"], -(-lay["split"] // lay["block_n"]) * lay["block_n"])
                nsplit = td.splits_for(plane.capacity, kind == "growing", lay["split"])
                ws = td.DecodeWorkspace(1, KV, H // KV, D, nsplit, dev)
                try:
                    fused = graph_us(lambda: td.fused_decode_attention(
                        qkv, pos, cos, sin, qn, kn, 1e-6, table, meta, H, KV, D, nsplit, 0.0625,
                        None, False, ws=ws, out=out, capacity=cap, **lay))
                    q = qkv[:, :H * D].view(1, H, D).contiguous()
                    given = graph_us(lambda: td.decode_attention(
                        q, pos, table, meta, KV, nsplit, 0.0625, None, capacity=cap, ws=ws, out=out,
                        **lay))
                    print(f"{kind} ctx {ctx} {name}: fused {fused:.2f} us, q-given {given:.2f} us "
                          f"({nsplit} programs)", flush=True)
                    if "--profiled" in sys.argv[1:] and name == "default":
                        torch.cuda.synchronize()
                        torch.cuda.cudart().cudaProfilerStart()
                        td.fused_decode_attention(qkv, pos, cos, sin, qn, kn, 1e-6, table, meta,
                                                  H, KV, D, nsplit, 0.0625, None, False, ws=ws,
                                                  out=out, capacity=cap, **lay)
                        torch.cuda.synchronize()
                        torch.cuda.cudart().cudaProfilerStop()
                except Exception as e:                                 # noqa: BLE001
                    print(f"{kind} ctx {ctx} {name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
