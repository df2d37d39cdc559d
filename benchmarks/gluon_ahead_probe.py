"""FA3's intra-warpgroup overlap in Gluon at the exact chunk kernel's wide shape (sm_90).

`ahead_probe.py` showed Triton's `tl.dot` waits for a tile's scores at once, so a warpgroup's
tensor-core and CUDA-core work alternate.  Gluon (`triton.experimental.gluon`, in the Triton
3.6 wheel) issues wgmmas asynchronously and waits explicitly.  This probe is the plain loop of
ahead_probe (128 query slots, 8 warps -- each warpgroup 64 whole rows --, D 256, 128 value
columns, 32-key tiles in three cp.async stages; tile_step's unmasked body in ARITHMETIC 3) in
Gluon:

    single  QK, softmax, the ones dot, p @ V a trip, each waited for at once (the tl kernel's
            schedule)
    ahead   trip i issues tile i + 1's QK first and runs tile i's softmax while it computes;
            the ones dot's wait retires both (wgmma groups complete in order)
    exact   the decode merge order on top (splits of 128 keys into groups of 16, merge_live),
            as nested loops -- 4 unrolled trips a split -- not as branches in a flat loop
    slab    exact with the total's [128, 128] float32 state in shared memory (read and written
            once a group): 64 registers a thread freed

Compiled for sm_90 here (Triton 3.6, thirty-first session): ahead 130 registers; exact 255
with spills (84 / 168 B); **exact slab ahead 225 registers, no spills, no serialization** --
~354 SASS instructions a trip with the split merge amortized, against roughly 490 for the tl kernel's
aligned whole-tile loop.  Two things ptxas taught: p @ V left in flight across the back edge,
or any async wgmma in a loop with a runtime branch (the tl kernel's split-end `if`), makes
ptxas serialize every wgmma (C7514: "non wgmma instructions reading accumulator registers");
the nested loops and a p @ V waited for in its trip compile clean.

Measured on the H200 (thirty-second session, `--run`, 264 programs, us a key tile an SM at
16k / 4k keys): tl single 1.006 / 1.059, tl ahead 1.038 / 1.095, gluon single 1.092 / 1.181,
gluon ahead 1.147 / 1.226, exact single 1.160 / 1.255, exact slab ahead 1.166 / 1.250 -- bits
as predicted (gluon == tl ahead, the exact variants equal), but Gluon is 8-9% slower than
Triton's own loop and issuing ahead costs 5% more: no route in the exact kernel followed.

The same wgmma chains (q from shared memory, K^T and V as shared descriptors, p from
registers) and the same elementwise ops in the same order as the tl loop, so the bits should
be ahead_probe's tl kernel's: `--run` checks that (torch.equal), the exact variants against
each other, and times all of them with the SMs full (a GPU, Gluon has no interpreter).

    PYTHONPATH=/tmp/t36:benchmarks:. python3 benchmarks/gluon_ahead_probe.py [--dump PREFIX]
    PYTHONPATH=benchmarks:. python3 benchmarks/gluon_ahead_probe.py --run [--n 16384]
"""
import argparse


def kernels():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                                   warpgroup_mma,
                                                                   warpgroup_mma_wait)

    @gluon.jit
    def issue(K, V, k_buf, v_buf, st, D: gl.constexpr, DPW: gl.constexpr, BN: gl.constexpr,
              ld: gl.constexpr):
        """cp.async of key tile st's K [BN, D] and V [BN, DPW] rows into the given buffers."""
        j = st + gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
        d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
        cp.async_copy_global_to_shared(k_buf, K + j[:, None] * D + d[None, :])
        dv = gl.arange(0, DPW, layout=gl.SliceLayout(0, ld))
        cp.async_copy_global_to_shared(v_buf, V + j[:, None] * D + dv[None, :])
        cp.commit_group()

    @gluon.jit
    def merge_live(M, L, A, m, l, a, r_sl: gl.constexpr, o_sl: gl.constexpr):
        """triton_attn.merge_live: a split's partial into a running state (M in the scores'
        row layout, L in the ones dot's, A in the accumulator's)."""
        M_new = gl.maximum(M, m)
        none = M_new == float("-inf")
        alpha = gl.where(none, 0.0, gl.exp(M - M_new))
        w = gl.where(none, 0.0, gl.where(M == float("-inf"), 1.0, gl.exp(m - M_new)))
        L = L * gl.convert_layout(alpha, r_sl) + gl.convert_layout(w, r_sl) * l
        A = A * gl.convert_layout(alpha, o_sl)[:, None] + gl.convert_layout(w, o_sl)[:, None] * a
        return M_new, L, A

    @gluon.jit
    def trip(st, n, sc, m, l, acc, q_s, k_s, v_s, ones_s, zs, zr, K, V, D: gl.constexpr,
             DPW: gl.constexpr, BN: gl.constexpr, s_l: gl.constexpr, o_l: gl.constexpr,
             r_l: gl.constexpr, ld: gl.constexpr, AHEAD: gl.constexpr):
        """Key tile st (its scores sc given) folded into (m, l, acc); returns tile st + BN's
        scores.  Tile i sits in buffer i % 3; the trip loads tile i + 2 into tile i - 1's
        buffer (p @ V(i - 1), its last reader, was waited for).  AHEAD: tile i + 1's QK is
        issued first and computes during this tile's softmax."""
        b1 = (st // BN + 1) % 3
        if AHEAD:
            cp.wait_group(0)                                  # tile i + 1 is in
            fence_async_shared()
            nsc = warpgroup_mma(q_s, k_s.index(b1).permute((1, 0)), zs, use_acc=False,
                                is_async=True)
        # tile_step's unmasked body (ARITHMETIC 3: scores unscaled, scale 1/16)
        m_new = gl.maximum(m, gl.max(sc, 1) * 0.0625)
        alpha = gl.exp(m - m_new)
        p = gl.exp2(gl.fma(sc, 0.0625 * 1.4426950408889634,
                           (-(m_new * 1.4426950408889634))[:, None])).to(gl.bfloat16)
        issue(K, V, k_s.index((st // BN + 2) % 3), v_s.index((st // BN + 2) % 3),
              gl.minimum(st + 2 * BN, n - BN), D, DPW, BN, ld)        # the last trips: again
        pr = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=r_l, k_width=2))
        rs = warpgroup_mma(pr, ones_s, zr, use_acc=False, is_async=True)
        if AHEAD:                     # groups complete in order: QK(i + 1) with the ones dot
            rs, sc = warpgroup_mma_wait(0, deps=(rs, nsc))
        else:
            rs = warpgroup_mma_wait(0, deps=(rs,))
        l = l * gl.convert_layout(alpha, gl.SliceLayout(1, r_l)) + gl.max(rs, 1)
        po = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2))
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(po, v_s.index((st // BN) % 3), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        if not AHEAD:
            cp.wait_group(1)                                  # tile i + 1 is in
            fence_async_shared()
            sc = warpgroup_mma(q_s, k_s.index(b1).permute((1, 0)), zs, use_acc=False)
        return sc, m_new, l, acc

    @gluon.jit
    def loop(Q, K, V, O, n, BM: gl.constexpr, D: gl.constexpr, DPW: gl.constexpr,
             BN: gl.constexpr, AHEAD: gl.constexpr, EXACT: gl.constexpr = False,
             SLAB: gl.constexpr = False):
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                      instr_shape=[16, BN, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                      instr_shape=[16, DPW, 16])
        r_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                      instr_shape=[16, 16, 16])
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
        sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
        sh1: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16,
                                                 rank=2)
        r_sl: gl.constexpr = gl.SliceLayout(1, r_l)
        o_sl: gl.constexpr = gl.SliceLayout(1, o_l)
        m_sl: gl.constexpr = gl.SliceLayout(1, s_l)
        i = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
        d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
        q_s = gl.allocate_shared_memory(gl.bfloat16, [BM, D], sh,
                                        gl.load(Q + i[:, None] * D + d[None, :]))
        ones_s = gl.allocate_shared_memory(gl.bfloat16, [BN, 16], sh1,
                                           gl.full([BN, 16], 1.0, gl.bfloat16, layout=ld))
        k_s = gl.allocate_shared_memory(gl.bfloat16, [3, BN, D], sh)       # three stages
        v_s = gl.allocate_shared_memory(gl.bfloat16, [3, BN, DPW], sh)
        m = gl.full([BM], float("-inf"), gl.float32, layout=m_sl)
        l = gl.zeros([BM], gl.float32, layout=r_sl)
        acc = gl.zeros([BM, DPW], gl.float32, layout=o_l)
        zs = gl.zeros([BM, BN], gl.float32, layout=s_l)
        zr = gl.zeros([BM, 16], gl.float32, layout=r_l)
        issue(K, V, k_s.index(0), v_s.index(0), 0, D, DPW, BN, ld)
        issue(K, V, k_s.index(1), v_s.index(1), gl.minimum(BN, n - BN), D, DPW, BN, ld)
        cp.wait_group(1)
        fence_async_shared()
        sc = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zs, use_acc=False)
        if EXACT:
            # the decode merge order with loops, not branches (a runtime branch in the trip
            # loop made ptxas serialize the in-flight QK, C7514): splits of 128 keys (4 trips,
            # unrolled), groups of 16 splits, n a multiple of 2,048 (merge_live's empty state)
            Mt = gl.full([BM], float("-inf"), gl.float32, layout=m_sl)
            Lt = gl.full([BM], -0.0, gl.float32, layout=r_sl)
            At = gl.full([BM, DPW], -0.0, gl.float32, layout=o_l)
            if SLAB:                  # the total's [BM, DPW] in shared memory: read and
                # written once a group (every 2,048 keys), 64 registers a thread freed
                at_s = gl.allocate_shared_memory(gl.float32, [BM, DPW], gl.SwizzledSharedLayout(
                    vec=1, per_phase=1, max_phase=1, order=[1, 0]), At)
            for g in range(0, n, 2048):
                Mg = gl.full([BM], float("-inf"), gl.float32, layout=m_sl)
                Lg = gl.full([BM], -0.0, gl.float32, layout=r_sl)
                Ag = gl.full([BM, DPW], -0.0, gl.float32, layout=o_l)
                for a in range(g, g + 2048, 128):
                    m = gl.full([BM], float("-inf"), gl.float32, layout=m_sl)
                    l = gl.zeros([BM], gl.float32, layout=r_sl)
                    acc = gl.zeros([BM, DPW], gl.float32, layout=o_l)
                    for j in gl.static_range(4):
                        sc, m, l, acc = trip(a + j * BN, n, sc, m, l, acc, q_s, k_s, v_s,
                                             ones_s, zs, zr, K, V, D, DPW, BN, s_l, o_l, r_l,
                                             ld, AHEAD)
                    Mg, Lg, Ag = merge_live(Mg, Lg, Ag, m, l, acc, r_sl, o_sl)
                if SLAB:
                    Mt, Lt, At1 = merge_live(Mt, Lt, at_s.load(o_l), Mg, Lg, Ag, r_sl, o_sl)
                    at_s.store(At1)
                else:
                    Mt, Lt, At = merge_live(Mt, Lt, At, Mg, Lg, Ag, r_sl, o_sl)
            if SLAB:
                At = at_s.load(o_l)
            acc = At
            l = Lt
        else:
            for st in range(0, n, BN):
                sc, m, l, acc = trip(st, n, sc, m, l, acc, q_s, k_s, v_s, ones_s, zs, zr, K, V,
                                     D, DPW, BN, s_l, o_l, r_l, ld, AHEAD)
        io = gl.arange(0, BM, layout=gl.SliceLayout(1, o_l))
        dv = gl.arange(0, DPW, layout=gl.SliceLayout(0, o_l))
        gl.store(O + io[:, None] * DPW + dv[None, :], acc / gl.convert_layout(l, o_sl)[:, None])

    return loop


def build(loop, ahead: bool, exact: bool = False, slab: bool = False):
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    names = list(inspect.signature(loop.fn).parameters)
    consts = dict(BM=128, D=256, DPW=128, BN=32, AHEAD=ahead, EXACT=exact, SLAB=slab)
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*fp32", "n": "i32",
           **{k: "constexpr" for k in consts}}
    attrs = {(names.index(x),): [["tt.divisibility", 16]] for x in ("Q", "K", "V", "O", "n")}
    src = GluonASTSource(fn=loop, signature=sig, attrs=attrs,
                         constexprs={(names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 8, "enable_fp_fusion": False})


def run(n: int, programs: int) -> None:
    """On a GPU: the bits (each Gluon variant against ahead_probe's tl loop, torch.equal) and
    the times of `programs` copies of each loop side by side (each program the same 128 rows
    over the same n keys: the loop's throughput with the SMs full)."""
    import torch
    import triton

    import ahead_probe
    import pair_split_probe
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16)
    shape = dict(BM=128, D=256, DPW=128, BN=32, num_warps=8, enable_fp_fusion=False)
    gl_loop, tl_ahead, tl_single = kernels(), ahead_probe.kernels(), pair_split_probe.kernels()
    runs = {"tl single (ARITHMETIC 2 softmax)": (tl_single, dict(PAIR=False, num_stages=3)),
            "tl ahead": (tl_ahead, dict(PAIR=False, num_stages=3)),
            "gluon single": (gl_loop, dict(AHEAD=False)),
            "gluon ahead": (gl_loop, dict(AHEAD=True)),
            "gluon exact single": (gl_loop, dict(AHEAD=False, EXACT=True)),
            "gluon exact slab single": (gl_loop, dict(AHEAD=False, EXACT=True, SLAB=True)),
            "gluon exact slab ahead": (gl_loop, dict(AHEAD=True, EXACT=True, SLAB=True))}
    outs = {}
    for name, (fn, extra) in runs.items():
        out = torch.empty(128, 128, device="cuda", dtype=torch.float32)

        def go(grid, fn=fn, extra=extra, out=out):
            fn[(grid,)](q, k, v, out, n, **shape, **extra)
        go(1)
        torch.cuda.synchronize()
        outs[name] = out.clone()
        ms = triton.testing.do_bench(lambda: go(programs), warmup=5, rep=50)
        # one program an SM at a time (the exact kernel's 255 registers): the time of one key
        # tile, comparable with the engine's global layer -- 2.666 ms for 16k rows, 262,656
        # program-tiles on 132 SMs: ~1.34 us (ncu_chunk.py, thirty-first session)
        tile_us = ms * 1e3 * sms / (programs * n // 32)
        print(f"{name}: {ms:.3f} ms for {programs} programs x {n} keys, {tile_us:.3f} us a "
              f"tile an SM", flush=True)
    for name, base in (("gluon single", "tl ahead"), ("gluon ahead", "tl ahead"),
                       ("gluon exact slab single", "gluon exact single"),
                       ("gluon exact slab ahead", "gluon exact single"),
                       ("gluon exact single", "tl ahead")):      # the last: merges move bits
        ref = outs[base]
        print(f"{name} == {base}: {torch.equal(outs[name], ref)} "
              f"(max |diff| {float((outs[name] - ref).abs().max()):.3g})", flush=True)


def main():
    from ahead_probe import summary
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write each variant's PTX here (a prefix)")
    ap.add_argument("--run", action="store_true", help="on a GPU: bits and times")
    ap.add_argument("--n", type=int, default=16384,
                    help="keys a program walks (--run; a multiple of 2,048: the exact loops)")
    ap.add_argument("--programs", type=int, default=264, help="programs a launch (--run)")
    args = ap.parse_args()
    if args.run:
        run(args.n, args.programs)
        return
    loop = kernels()
    for exact, slab, ahead in ((False, False, False), (False, False, True), (True, False, False),
                               (True, False, True), (True, True, False), (True, True, True)):
        name = ("exact " if exact else "") + ("slab " if slab else "") + (
            "ahead" if ahead else "single")
        ptx = build(loop, ahead, exact, slab).asm["ptx"]
        if args.dump:
            open(f"{args.dump}gluon-{name.replace(' ', '-')}.ptx", "w").write(ptx)
        print(f"gluon {name}: {summary(ptx)}", flush=True)


if __name__ == "__main__":
    main()
