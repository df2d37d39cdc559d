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
   nested loop) and other key tiles and splits.
3. Between the two (`steps`): the exact kernel's habits added to the plain kernel one at a
   time -- row sums by a dot with ones, exp with a guarded alpha and no FMA contraction,
   state kept by select where a row sees nothing, and the split / group / total structure.

Every Triton variant is checked against FlashAttention-2 (max |diff| printed; bf16 output).

    PYTHONPATH=. python3 benchmarks/fa_ceiling.py [--rows 16384] [--reps 5] [--parts fa,steps,exact,slots,align,wide,others,deep]
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
EXACT = [("exact chunk, default layout (32-key tiles, 128-key splits)", {}),
         ("exact chunk, GR32F (32-key tiles and splits, flat)", {"split": 32, "chunk_loop": "flat"}),
         ("exact chunk, 64-key tiles and splits, flat", {"block_n": 64, "split": 64,
                                                         "chunk_loop": "flat"}),
         ("exact chunk, 64-key tiles, 128-key splits, nested", {"block_n": 64, "split": 128}),
         ("exact chunk, 128-key tiles and splits, flat", {"block_n": 128, "split": 128,
                                                          "chunk_loop": "flat"})]
# the default layout with other query tiles (a launch shape: rows never meet): (slots, warps)
SLOTS = [(64, 4), (32, 4), (32, 8), (16, 4)]
# the default layout with aligned row runs and no state-keeping select (lay["align"]):
# (slots, warps); torch.equal against the default printed
ALIGNED = [("tiles", 64, 8), (True, 64, 8), (True, 64, 4), (True, 32, 4)]

# the default layout (aligned, flat) with other query tiles and value-column slices (a launch
# shape: the same bits): (slots, warps, dsplit).  Why: at 8 warps a [64, 32] score tile splits
# its 32 keys over two warpgroups (sm_90: m64n16 wgmma, the row max and p @ V's operand through
# shared memory every tile); 128 slots put the warpgroups on rows, 4 warps keep one -- the
# accumulators fit only in column slices (each slice recomputes the scores)
WIDE = [(64, 8, 1), (128, 8, 2), (128, 8, 4), (64, 4, 2), (64, 4, 4), (32, 4, 2)]
# the wide default's neighbours (twenty-fifth session): 16 warps at 128 slots (whole or in
# halves), and the default route at each software-pipeline depth -- a global and a sliding
# layer: (slots, warps, dsplit, stages); None = the route's own choice
DEEP = [(128, 16, 1, None), (128, 16, 2, None), (None, None, None, 2), (None, None, None, 3),
        (None, None, None, 4)]
# the same question on a sliding layer (window 512, the ring layout, unaligned: its selects
# kept), a G = 2 global layer (Gemma 3 4B: 8 heads over 4 KV heads; 64 slots are 32 rows,
# aligned) and a G = 2 sliding one (the 4B's window, 1,024) -- (label, heads, kv, window, shapes)
OTHERS = [("sliding, window 512", 4, 1, 512, [(64, 8, 1), (128, 8, 2), (64, 4, 2)]),
          ("global, G 2", 8, 4, None, [(64, 8, 1), (64, 4, 2), (128, 8, 2)]),
          ("sliding G 2, window 1024", 8, 4, 1024, [(64, 8, 1), (64, 4, 2), (128, 8, 2)])]

# the exact kernel's habits added to flash attention one at a time (BM 64, BN 32)
STEPS = [("4 warps", {}), ("+ row sums by a dot with ones", {"ones": True}),
         ("+ exp, guarded alpha, no FMA fusion", {"exp": True, "fusion": False}),
         ("+ state kept by select on masked tiles", {"sel": True}),
         ("all three", {"ones": True, "exp": True, "fusion": False, "sel": True}),
         ("all three + 4-tile splits, groups of 16 (3 accumulators)",
          {"ones": True, "exp": True, "fusion": False, "sel": True, "splits": 4}),
         ("all three + splits, 8 warps",
          {"ones": True, "exp": True, "fusion": False, "sel": True, "splits": 4, "warps": 8}),
         ("exp + splits only, 8 warps", {"exp": True, "splits": 4, "warps": 8})]


@functools.lru_cache(maxsize=None)
def _fa():
    import triton
    import triton.language as tl

    from muser.backends.cuda.triton_attn import pieces

    @triton.jit
    def fold(q, k, v, kk, rows, m, l, acc, ones, qk_scale, MASKED: tl.constexpr,
             ONES: tl.constexpr, EXP: tl.constexpr, SEL: tl.constexpr):
        """One key tile into the running softmax (flash attention's step), with the exact
        kernel's habits one at a time: ONES the row sums as a dot with ones, EXP exp (not
        exp2) and its guarded alpha, SEL a row that sees none of a masked tile keeps its
        state by select (two accumulators live)."""
        s = tl.dot(q, tl.trans(k)) * qk_scale                # [BM, BN]
        see = kk[None, :] <= rows[:, None]
        if MASKED:
            s = tl.where(see, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        if EXP:
            alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
            p = tl.exp(s - m_new[:, None])
        else:
            alpha = tl.math.exp2(m - m_new)
            p = tl.math.exp2(s - m_new[:, None])
        if MASKED and EXP:
            p = tl.where(see, p, 0.0)
        p = p.to(v.dtype)
        if ONES:
            l_new = l * alpha + tl.max(tl.dot(p, ones), 1)
        else:
            l_new = l * alpha + tl.sum(p.to(tl.float32), 1)
        acc_new = tl.dot(p, v, acc * alpha[:, None])
        if MASKED and SEL:
            live = tl.max(see.to(tl.int32), 1) > 0
            return (tl.where(live, m_new, m), tl.where(live, l_new, l),
                    tl.where(live[:, None], acc_new, acc))
        return m_new, l_new, acc_new

    globals()["fold"] = fold            # the interpreter looks for names in module globals

    merge = pieces()["_merge_one"]      # the exact kernels' merge, selects and all
    globals()["merge"] = merge

    @triton.jit
    def fa_kernel(Q, K, V, O, N, qk_scale, H: tl.constexpr, KVH: tl.constexpr,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  ONES: tl.constexpr = False, EXP: tl.constexpr = False,
                  SEL: tl.constexpr = False, SPLITS: tl.constexpr = 0):
        # heavy tiles (late rows: more keys) first
        t = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
        kvh = h // (H // KVH)
        rows = t * BM + tl.arange(0, BM)                     # [BM]
        d = tl.arange(0, D)
        live = rows < N
        q = tl.load(Q + (rows[:, None].to(tl.int64) * H + h) * D + d[None, :],
                    mask=live[:, None], other=0.0)           # [BM, D]
        ones = tl.full([BN, 16], 1.0, Q.dtype.element_ty)
        m = tl.full([BM], float("-inf"), tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        # SPLITS > 0: the exact kernel's structure -- a split of SPLITS tiles from empty, folded
        # into a group at its end, groups of 16 splits into a total (three accumulators)
        Mg = tl.full([BM], float("-inf"), tl.float32)
        Lg = tl.zeros([BM], tl.float32)
        Ag = tl.zeros([BM, D], tl.float32)
        Mt = tl.full([BM], float("-inf"), tl.float32)
        Lt = tl.zeros([BM], tl.float32)
        At = tl.zeros([BM, D], tl.float32)
        hi = tl.minimum(t * BM + BM, N)
        whole = (t * BM) // BN * BN                          # keys every row sees: [0, whole)
        for st in range(0, hi, BN):
            kk = st + tl.arange(0, BN)
            off = (kk[:, None].to(tl.int64) * KVH + kvh) * D + d[None, :]
            ok = kk < N
            k = tl.load(K + off, mask=ok[:, None], other=0.0)
            v = tl.load(V + off, mask=ok[:, None], other=0.0)
            if SPLITS > 0:
                fresh = (st // BN) % SPLITS == 0
                m = tl.where(fresh, float("-inf"), m)
                l = tl.where(fresh, 0.0, l)
                acc = tl.where(fresh, 0.0, acc)
            if st < whole:
                m, l, acc = fold(q, k, v, kk, rows, m, l, acc, ones, qk_scale, False, ONES, EXP,
                                 SEL)
            else:
                m, l, acc = fold(q, k, v, kk, rows, m, l, acc, ones, qk_scale, True, ONES, EXP,
                                 SEL)
            if SPLITS > 0:
                last = st + BN >= hi
                if ((st // BN) % SPLITS == SPLITS - 1) | last:
                    Mg, Lg, Ag = merge(Mg, Lg, Ag, m, l, acc)
                    if ((st // BN // SPLITS) % 16 == 15) | last:
                        Mt, Lt, At = merge(Mt, Lt, At, Mg, Lg, Ag)
                        Mg = tl.full([BM], float("-inf"), tl.float32)
                        Lg = tl.zeros([BM], tl.float32)
                        Ag = tl.zeros([BM, D], tl.float32)
        if SPLITS > 0:
            l = Lt
            acc = At
        tl.store(O + (rows[:, None].to(tl.int64) * H + h) * D + d[None, :],
                 (acc / l[:, None]).to(O.dtype.element_ty), mask=live[:, None])

    return fa_kernel


def triton_fa(q, k, v, bm, bn, warps, stages, ones=False, exp=False, sel=False, splits=0,
              fusion=True):
    n = q.shape[0]
    out = torch.empty_like(q)
    _fa()[(-(-n // bm), H)](q, k, v, out, n, SCALE * (1.0 if exp else 1.4426950408889634),
                            H=H, KVH=KV, D=D, BM=bm, BN=bn, ONES=ones, EXP=exp, SEL=sel,
                            SPLITS=splits, num_warps=warps, num_stages=stages,
                            enable_fp_fusion=fusion)
    return out


def flash(q, k, v):
    n = q.shape[0]
    return torch.ops.aten._flash_attention_forward(q[None], k[None], v[None], None, None, n, n,
                                                    0.0, True, False, scale=SCALE)[0][0]


def row(name, fn, reps, flops, last):
    """One table row: fn's median time over reps, its TFLOP/s (flops 0: left blank) and
    last(output) -- or why it failed (a variant that does not compile is this probe's answer,
    not a crash).  Returns the output, None on a failure."""
    try:
        out = fn()
        ms = timed(fn, reps)
    except Exception as e:                                              # noqa: BLE001
        print(f"| {name} | failed: {type(e).__name__} {str(e)[:120]} | | |", flush=True)
        return None
    rate = f"{flops / ms / 1e9:.0f}" if flops else ""
    print(f"| {name} | {ms:.2f} | {rate} | {last(out)} |", flush=True)
    return out


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
    ap.add_argument("--parts", default="fa,steps,exact,slots,align",
                    help="which rows besides FA-2: fa (plain Triton by tile), steps (the exact "
                         "kernel's habits added to it), exact (the chunk kernel's layouts), slots "
                         "(its query tiles and warps), align (aligned row runs, no keeping select), wide "
                         "(query tiles, warps and value-column slices on the default), others (the same "
                         "for a sliding layer and a G 2 global layer), deep (16 warps, pipeline depths)")
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

    def diff(out):
        return f"{(out.float() - ref.float()).abs().max().item():.3g}"

    for bm, bn, warps, stages in CONFIGS if "fa" in parts else ():
        row(f"Triton FA BM {bm} BN {bn} warps {warps} stages {stages}",
            functools.partial(triton_fa, q, k, v, bm, bn, warps, stages), a.reps, flops, diff)
    for name, kw in STEPS if "steps" in parts else ():
        row(f"flash, BM 64, BN 32: {name}",
            functools.partial(triton_fa, q, k, v, 64, 32, kw.get("warps", 4), 2,
                              **{x: y for x, y in kw.items() if x != "warps"}),
            a.reps, flops, diff)
    from muser.backends.cuda.triton_attn import layout
    from muser.backends.cuda.triton_chunk import chunk_attention
    base = layout(True, D)
    exact = chunk_attention(q, k, v, 0, 0, None, SCALE, None, False, base)

    def same(out):
        return f"equal to the default: {torch.equal(out, exact)}"

    for mode, bm, warps in ALIGNED if "align" in parts else ():
        what = "no keeping select" if mode == "tiles" else "no selects"
        row(f"exact chunk, aligned rows, {what}, {bm} slots, {warps} warps",
            functools.partial(chunk_attention, q, k, v, 0, 0, None, SCALE, None, False,
                              {**base, "align": mode}, block_m=bm, warps=warps),
            a.reps, flops, same)
    for bm, warps, ds in WIDE if "wide" in parts else ():
        row(f"exact chunk, {bm} slots, {warps} warps, {ds} column slices",
            functools.partial(chunk_attention, q, k, v, 0, 0, None, SCALE, None, False, base,
                              block_m=bm, warps=warps, dsplit=ds),
            a.reps, flops, same)
    for label, window in (("global", None), ("sliding, window 512", 512)) if "deep" in parts else ():
        first = []
        for bm, warps, ds, stages in [(None, None, None, None)] + DEEP:
            out = row(f"{label}: {bm or 'route'} slots, {warps or 'route'} warps, "
                      f"{ds or 'route'} column slices, {stages or 'default'} stages",
                      functools.partial(chunk_attention, q, k, v, 0, 0, window, SCALE, None,
                                        False, layout(window is None, D), block_m=bm or 64,
                                        warps=warps, dsplit=ds, stages=stages),
                      a.reps, 0, lambda o: f"equal to the first: "
                                           f"{torch.equal(o, first[0] if first else o)}")
            if out is not None and not first:
                first.append(out)
    for label, heads, kvh, window, shapes in OTHERS if "others" in parts else ():
        qo = torch.randn(a.rows, heads, D, device=dev, dtype=dt)
        ko = torch.randn(a.rows, kvh, D, device=dev, dtype=dt)
        vo = torch.randn(a.rows, kvh, D, device=dev, dtype=dt)
        first = []                                   # the first shape's output: the others' ref
        for bm, warps, ds in shapes:
            out = row(f"{label}: {bm} slots, {warps} warps, {ds} column slices",
                      functools.partial(chunk_attention, qo, ko, vo, 0, 0, window, SCALE, None,
                                        False, layout(window is None, D), block_m=bm,
                                        warps=warps, dsplit=ds),
                      a.reps, 0, lambda o: f"equal to the first: "
                                           f"{torch.equal(o, first[0] if first else o)}")
            if out is not None and not first:
                first.append(out)
    runs = [(name, over, 64, None) for name, over in (EXACT if "exact" in parts else EXACT[:1])]
    runs += [(f"exact chunk, default layout, {bm} slots, {w} warps", {}, bm, w)
             for bm, w in (SLOTS if "slots" in parts else ())]
    for name, over, bm, warps in runs:
        row(name, functools.partial(chunk_attention, q, k, v, 0, 0, None, SCALE, None, False,
                                    {**base, **over}, block_m=bm, warps=warps),
            a.reps, flops, diff)

if __name__ == "__main__":
    main()
