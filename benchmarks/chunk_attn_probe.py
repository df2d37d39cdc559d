"""Which chunk-attention tiles give a row the decode step's bits, and what they cost (CUDA).

Part 1 runs tests/cuda/test_triton_chunk.py's decode-vs-chunk case with several query-slot
counts per tile and prints the rows (and their slot in the tile) whose bits differ.  Part 2
times chunk_attention at the Gemma-3-1B shape (4 heads, 1 KV head, D 256): a 16k prefill's
global layer in 4k-row chunks and a sliding layer (window 512), against FlashAttention-2.

Part 3 runs the decode kernel twice, with a NaN-poisoned workspace (a stale partial would
show) and with one split, against the chunk kernel; part 4 holds the fused decode launch against
its pieces (the q it attends with, the row it stores, the q-given form on the same plane) --
the probe that found the fused form's dots differing (benchmarks/NOTES.md, sixth session).

    PYTHONPATH=.:tests/cuda python3 benchmarks/chunk_attn_probe.py [1] [2] [3] [4]
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


def compiled(jit):
    """(num_warps, num_stages, registers, spilled bytes) of each binary a jit function built."""
    out = []
    for caches in getattr(jit, "device_caches", {}).values():
        for ck in (caches[0].values() if isinstance(caches, tuple) else []):
            md = getattr(ck, "metadata", None)
            out.append((getattr(md, "num_warps", "?"), getattr(md, "num_stages", "?"),
                        getattr(ck, "n_regs", "?"), getattr(ck, "n_spills", "?")))
    return out


def part2():
    from muser.backends.cuda.triton_attn import layout
    from muser.backends.cuda.triton_chunk import _kernel, chunk_attention
    dev, dt = "cuda", torch.bfloat16
    H, KV, D, N = 4, 1, 256, 16384
    k = torch.randn(N, KV, D, device=dev, dtype=dt)
    v = torch.randn(N, KV, D, device=dev, dtype=dt)
    q = torch.randn(N, H, D, device=dev, dtype=dt)
    for growing, window in ((True, None), (False, 512)):
        base = layout(growing, D)
        for bm, warps, stages, loop, ds, inter, accd in (
                (64, 8, None, base["chunk_loop"], 1, True, True),
                (64, 8, None, base["chunk_loop"], 1, True, False),
                (64, 8, None, base["chunk_loop"], 1, False, False),
                (64, 8, None, base["chunk_loop"], 1, False, True),
                (64, 8, None, "nested" if base["chunk_loop"] == "flat" else "flat", 1, True, True)):
            lay = dict(base, chunk_loop=loop, dsplit=ds, interior=inter, acc_dot=accd)
            times = []
            for rep in range(2):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for a in range(0, N, 4096):
                    chunk_attention(q[a:a + 4096], k[:a + 4096], v[:a + 4096], a, 0, window, 0.0625,
                                    None, False, lay, block_m=bm, warps=warps, stages=stages)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            print(f"chunk_attention growing={growing} block_m={bm} warps={warps} stages={stages} "
                  f"{loop} dsplit={ds} interior={inter} acc_dot={accd}: {times[1] * 1e3:.2f} ms "
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
    print("chunk binaries (warps, stages, regs, spills):", compiled(_kernel()), flush=True)
    from muser.backends.cuda.triton_decode_kernel import _kernel as dk
    print("decode binaries (warps, stages, regs, spills):", compiled(dk()), flush=True)


def part3():
    """Where the decode and chunk bits part: decode run twice; one split (no merge); the
    workspace poisoned with NaN before every decode launch (a stale partial would show)."""
    from muser.backends.cuda import triton_decode as td
    dev, dt = "cuda", torch.bfloat16
    heads, kv, d = 4, 1, 256
    for kind in ("ring", "growing"):
        ins = T._inputs(heads, kv, d, dt, dev, False)
        for name, over in (("default", {}), ("one split", {"split": 256, "block_n": 32}),
                           ("tiles of 16", {"split": 32, "block_n": 16})):
            lay = {**T._layout(kind, d, 32), **over}
            r1, _, nsplit, cap = T._decode(kind, heads, kv, d, dt, dev, lay, *ins, d ** -0.5, None)
            r2 = T._decode(kind, heads, kv, d, dt, dev, lay, *ins, d ** -0.5, None)[0]
            orig = td.DecodeWorkspace.__init__

            def poisoned(self, *a, **k):
                orig(self, *a, **k)
                self.ms.fill_(float("nan"))
                self.ls.fill_(float("nan"))
                self.acc.fill_(float("nan"))
            td.DecodeWorkspace.__init__ = poisoned
            try:
                r3 = T._decode(kind, heads, kv, d, dt, dev, lay, *ins, d ** -0.5, None)[0]
            finally:
                td.DecodeWorkspace.__init__ = orig
            ch = T._chunks(kind, [150], heads, kv, d, dt, dev, lay, nsplit, cap, *ins, d ** -0.5, None,
                           64)[0]
            rows = lambda a, b: (a.float() - b.float()).abs().amax(dim=(1, 2)).gt(0).nonzero().flatten().tolist()  # noqa: E731
            print(f"{kind} {name}: decode twice {rows(r1, r2)[:10]}; poisoned nan rows "
                  f"{r3.isnan().any(dim=(1, 2)).nonzero().flatten().tolist()[:10]} vs r1 {rows(r1, r3)[:10]}; "
                  f"chunk vs r1 {rows(ch, r1)[:10]}", flush=True)


def part4():
    """Fused decode vs its pieces: the q the decode launch uses (emit_q) against prepare_rows'
    q, the plane row against prepare_rows' k, and the fused output against decode_attention
    (q given, keys from the plane) on the same plane."""
    from muser.backends.cuda import triton_decode as td
    from muser.cache.many import advance_lockstep
    dev, dt = "cuda", torch.bfloat16
    heads, kv, d = 4, 1, 256
    for kind in ("ring", "growing"):
        qkv, qn, kn, cos, sin = T._inputs(heads, kv, d, dt, dev, False)
        lay = T._layout(kind, d, 32)
        plane = T._plane(kind, kv, d, dt, dev)
        cap = plane.capacity if kind == "ring" else 0
        nsplit = td.splits_for(plane.capacity, kind == "growing", lay["split"])
        pos_all = torch.arange(150, device=dev)
        qp, kp_, vp_ = td.prepare_rows(qkv, pos_all, cos, sin, qn, kn, 1e-6, heads, kv, d, nsplit, False,
                                       capacity=cap, **lay)
        bad_q, bad_k, bad_sep = [], [], []
        for p in range(150):
            slot, n = advance_lockstep([plane], 1)
            table = torch.tensor([td.plane_row(plane)], dtype=torch.int64, device=dev)
            meta = torch.tensor([[slot, n]], dtype=torch.int64, device=dev)
            pos = pos_all[p:p + 1]
            qd = torch.full((1, heads, d), float("nan"), dtype=dt, device=dev)
            out = torch.empty(1, heads, d, dtype=dt, device=dev)
            td._launch(qkv[p:p + 1], None, pos, cos, sin, qn, kn, 1e-6, table, meta, heads, kv, d, nsplit,
                       d ** -0.5, None, False, None, out, capacity=cap, qout=qd, **lay)
            if not torch.equal(qd, qp[p:p + 1]):
                bad_q.append(p)
            row = plane.keys[slot] if kind == "ring" else plane.keys[:, slot]
            if not torch.equal(row, kp_[p]):
                bad_k.append(p)
            sep = td.decode_attention(qd, pos, table, meta, kv, nsplit, d ** -0.5, None, capacity=cap, **lay)
            if not torch.equal(sep, out):
                bad_sep.append(p)
        print(f"{kind}: q differs {bad_q[:10]}; k differs {bad_k[:10]}; fused vs q-given {bad_sep[:10]}",
              flush=True)


if __name__ == "__main__":
    for part in sys.argv[1:] or ["1", "2"]:
        {"1": part1, "2": part2, "3": part3, "4": part4}[part]()
