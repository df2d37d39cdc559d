"""Scores for two 32-key tiles in one dot, split after: compiled for sm_90 without a GPU.

The exact chunk kernel's wide route (a global layer: 128 query slots, 8 warps, value columns in
halves) computes a [128, 32] score tile per 32-key tile: `wgmma m64n32k16`, 16 k-steps over
D = 256, with q (the A operand) read from shared memory by every instruction.  At n32 each
instruction reads 2 KB of q and 1 KB of K for 64 x 32 x 16 MACs; at n64, 2 KB + 2 KB for twice
the MACs.  This probe compiles a plain online-softmax loop both ways -- one [BM, 32] dot a tile,
against one [BM, 64] dot a pair of tiles split into its halves (`tl.split` of the [BM, 2, 32]
reshape) and folded one after the other (the same per-tile steps, so the same order of sums)
-- and prints, for each: the layout conversions left in the loop (TTGIR), shared-memory and
shuffle instruction counts, the wgmma shapes and counts (PTX), and ptxas' registers / spills.

Twenty-ninth session (Triton 3.6, this machine): the split is free -- the halves come out in
the accumulator's own register layout (`#linear` = the n32 wgmma layout), the same four
conversions a tile as the single loop, the same shared-memory traffic a pair as a single tile,
16 x m64n64k16 a pair against 32 x m64n32k16, 132 registers against 130, no spills.
Thirtieth session, H200: it did not pay.  The route in the exact kernel (an opt-in knob, the
same bits) ran the 1B's global layers 3.75 -> 4.67 ms a layer at 16k (255 registers and 56-616
B of spills there, against 8-284 without): the probe's plain loop has registers to spare, the
exact kernel's three accumulators do not.  The route was removed; this probe stays the record.

    PYTHONPATH=/tmp/t36:. python3 benchmarks/pair_split_probe.py [--warps 8]
"""
import argparse
import inspect
import re


def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def fold(sc, v, m, l, acc, ones):
        """tile_step's unmasked body on given scores (triton_attn.py)."""
        m_new = tl.maximum(m, tl.max(sc, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None]).to(v.dtype)
        l_new = l * alpha + tl.max(tl.dot(p, ones, input_precision="ieee"), 1)
        acc_new = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        return m_new, l_new, acc_new

    @triton.jit
    def loop(Q, K, V, O, n, BM: tl.constexpr, D: tl.constexpr, DPW: tl.constexpr,
             BN: tl.constexpr, PAIR: tl.constexpr):
        i = tl.arange(0, BM)
        d = tl.arange(0, D)
        dv = tl.arange(0, DPW)
        q = tl.load(Q + i[:, None] * D + d[None, :])
        m = tl.full([BM], float("-inf"), tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, DPW], tl.float32)
        ones = tl.full([BN, 16], 1.0, tl.bfloat16)
        if PAIR:
            for st in range(0, n, 2 * BN):
                j = st + tl.arange(0, 2 * BN)
                k = tl.load(K + j[:, None] * D + d[None, :])
                sc = tl.dot(q, tl.trans(k), input_precision="ieee")          # [BM, 2 BN]
                # keys st .. st + BN - 1 | st + BN .. st + 2 BN - 1
                sa, sb = tl.split(tl.permute(tl.reshape(sc, [BM, 2, BN]), (0, 2, 1)))
                ja = st + tl.arange(0, BN)
                va = tl.load(V + ja[:, None] * D + dv[None, :])
                m, l, acc = fold(sa, va, m, l, acc, ones)
                vb = tl.load(V + (ja + BN)[:, None] * D + dv[None, :])
                m, l, acc = fold(sb, vb, m, l, acc, ones)
        else:
            for st in range(0, n, BN):
                j = st + tl.arange(0, BN)
                k = tl.load(K + j[:, None] * D + d[None, :])
                sc = tl.dot(q, tl.trans(k), input_precision="ieee")
                v = tl.load(V + j[:, None] * D + dv[None, :])
                m, l, acc = fold(sc, v, m, l, acc, ones)
        tl.store(O + i[:, None] * DPW + dv[None, :], acc / l[:, None])

    return loop


def build(loop, pair: bool, warps: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(inspect.signature(loop.fn).parameters)
    consts = dict(BM=128, D=256, DPW=128, BN=32, PAIR=pair)
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*fp32", "n": "i32",
           **{k: "constexpr" for k in consts}}
    attrs = {(names.index(x),): [["tt.divisibility", 16]] for x in ("Q", "K", "V", "O", "n")}
    src = ASTSource(fn=loop, signature=sig, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in consts.items()})
    # as the chunk kernel is launched: no FMA contraction, 3 stages
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": 3, "enable_fp_fusion": False})


def main():
    from sm90_ptx import ptxas_usage
    ap = argparse.ArgumentParser()
    ap.add_argument("--warps", type=int, default=8)
    args = ap.parse_args()
    loop = kernels()
    for pair in (False, True):
        c = build(loop, pair, args.warps)
        ttgir, ptx = c.asm["ttgir"], c.asm["ptx"]
        body = ttgir[ttgir.find("scf.for"):]
        counts = {k: len(re.findall(p, ptx)) for k, p in
                  (("st.shared", r"st\.shared"), ("ld.shared", r"ld\.shared"),
                   ("shfl", r"shfl\.sync"), ("ex2", r"ex2\.approx"))}
        shapes = {w.split(".")[4]: ptx.count(w) for w in
                  sorted(set(re.findall(r"wgmma\.mma_async[\w.]*", ptx)))}
        print(f"{'pair' if pair else 'single'}: convert_layout {body.count('ttg.convert_layout')} "
              f"in the loop, {counts}, wgmma {shapes}, {ptxas_usage(ptx)}", flush=True)


if __name__ == "__main__":
    main()
