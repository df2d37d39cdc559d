"""FA3's intra-warpgroup overlap in Gluon at the exact chunk kernel's wide shape (sm_90).

`ahead_probe.py` showed Triton's `tl.dot` waits for a tile's scores at once, so a warpgroup's
tensor-core and CUDA-core work alternate.  Gluon (`triton.experimental.gluon`, in the Triton
3.6 wheel) issues wgmmas asynchronously and waits explicitly.  This probe is the plain loop of
ahead_probe (128 query slots, 8 warps -- each warpgroup 64 whole rows --, D 256, 128 value
columns, 32-key tiles; tile_step's unmasked body in ARITHMETIC 3) written in Gluon, two ways:

    single  QK, softmax, the ones dot, p @ V a trip, each waited for at once (the tl kernel's
            schedule)
    ahead   trip i issues tile i + 1's QK, runs tile i's softmax while it computes, and leaves
            p @ V in flight until the next trip needs the accumulator:
                issue QK(i+1) | softmax(i) | wait PV(i-1) | ones dot(i), wait | issue PV(i)

Both run the same wgmma chains (q from shared memory, K^T and V as shared descriptors, p from
registers) and the same elementwise ops in the same order as the tl loop, so the bits should
be ahead_probe's tl kernel's -- `--run` checks that (torch.equal) and times the three on a GPU.
Without `--run` it compiles for sm_90 here and prints the wgmma waits (`wait_group N`, N > 0:
groups left in flight) and ptxas' registers / spills.

    PYTHONPATH=/tmp/t36:benchmarks:. python3 benchmarks/gluon_ahead_probe.py [--run --n 16384]
"""
import argparse
import collections
import re


def kernels():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared,
                                                                   warpgroup_mma,
                                                                   warpgroup_mma_init,
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
    def loop(Q, K, V, O, n, BM: gl.constexpr, D: gl.constexpr, DPW: gl.constexpr,
             BN: gl.constexpr, AHEAD: gl.constexpr):
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
        i = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
        d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
        q_s = gl.allocate_shared_memory(gl.bfloat16, [BM, D], sh,
                                        gl.load(Q + i[:, None] * D + d[None, :]))
        ones_s = gl.allocate_shared_memory(gl.bfloat16, [BN, 16], sh1,
                                           gl.full([BN, 16], 1.0, gl.bfloat16, layout=ld))
        # three stages: tile i in buffer i % 3; trip i loads tile i + 2 into tile i - 1's
        # buffer once p @ V(i - 1), its last reader, is waited for
        k_s = gl.allocate_shared_memory(gl.bfloat16, [3, BN, D], sh)
        v_s = gl.allocate_shared_memory(gl.bfloat16, [3, BN, DPW], sh)
        m = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, r_l))
        acc = gl.zeros([BM, DPW], gl.float32, layout=o_l)
        if AHEAD:                     # p @ V stays in flight across the back edge: a token
            acc = warpgroup_mma_init(acc)
        zs = gl.zeros([BM, BN], gl.float32, layout=s_l)
        zr = gl.zeros([BM, 16], gl.float32, layout=r_l)
        issue(K, V, k_s.index(0), v_s.index(0), 0, D, DPW, BN, ld)
        issue(K, V, k_s.index(1), v_s.index(1), gl.minimum(BN, n - BN), D, DPW, BN, ld)
        cp.wait_group(1)
        fence_async_shared()
        sc = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zs, use_acc=False)
        for st in range(0, n, BN):
            b = (st // BN) % 3
            b1 = (st // BN + 1) % 3
            if AHEAD:
                cp.wait_group(0)                              # tile i + 1 is in
                fence_async_shared()
                nsc = warpgroup_mma(q_s, k_s.index(b1).permute((1, 0)), zs, use_acc=False,
                                    is_async=True)
            # tile_step's unmasked body (ARITHMETIC 3: scores unscaled, scale 1/16)
            m_new = gl.maximum(m, gl.max(sc, 1) * 0.0625)
            alpha = gl.exp(m - m_new)
            p = gl.exp2(gl.fma(sc, 0.0625 * 1.4426950408889634,
                               (-(m_new * 1.4426950408889634))[:, None])).to(gl.bfloat16)
            if AHEAD:
                acc = warpgroup_mma_wait(1, deps=(acc,))     # PV(i-1) done; QK(i+1) may run on
            issue(K, V, k_s.index((st // BN + 2) % 3), v_s.index((st // BN + 2) % 3),
                  gl.minimum(st + 2 * BN, n - BN), D, DPW, BN, ld)    # the last trips: again
            pr = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=r_l,
                                                          k_width=2))
            rs = warpgroup_mma(pr, ones_s, zr, use_acc=False, is_async=True)
            if AHEAD:                 # groups complete in order: QK(i+1) with the ones dot
                rs, sc_next = warpgroup_mma_wait(0, deps=(rs, nsc))
            else:
                rs = warpgroup_mma_wait(0, deps=(rs,))
            l = l * gl.convert_layout(alpha, gl.SliceLayout(1, r_l)) + gl.max(rs, 1)
            po = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=o_l,
                                                          k_width=2))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
            acc = warpgroup_mma(po, v_s.index(b), acc, is_async=True)
            if AHEAD:
                sc = sc_next
            else:
                acc = warpgroup_mma_wait(0, deps=(acc,))
                cp.wait_group(1)                              # tile i + 1 is in
                fence_async_shared()
                sc = warpgroup_mma(q_s, k_s.index(b1).permute((1, 0)), zs, use_acc=False)
            m = m_new
        acc = warpgroup_mma_wait(0, deps=(acc,))
        io = gl.arange(0, BM, layout=gl.SliceLayout(1, o_l))
        dv = gl.arange(0, DPW, layout=gl.SliceLayout(0, o_l))
        gl.store(O + io[:, None] * DPW + dv[None, :],
                 acc / gl.convert_layout(l, gl.SliceLayout(1, o_l))[:, None])

    return loop


def build(loop, ahead: bool):
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    names = list(inspect.signature(loop.fn).parameters)
    consts = dict(BM=128, D=256, DPW=128, BN=32, AHEAD=ahead)
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
    q = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16)
    shape = dict(BM=128, D=256, DPW=128, BN=32, num_warps=8, enable_fp_fusion=False)
    gl_loop, tl_ahead, tl_single = kernels(), ahead_probe.kernels(), pair_split_probe.kernels()
    runs = {"tl single (ARITHMETIC 2 softmax)": (tl_single, dict(PAIR=False, num_stages=3)),
            "tl ahead": (tl_ahead, dict(PAIR=False, num_stages=3)),
            "gluon single": (gl_loop, dict(AHEAD=False)),
            "gluon ahead": (gl_loop, dict(AHEAD=True))}
    outs = {}
    for name, (fn, extra) in runs.items():
        out = torch.empty(128, 128, device="cuda", dtype=torch.float32)

        def go(grid, fn=fn, extra=extra, out=out):
            fn[(grid,)](q, k, v, out, n, **shape, **extra)
        go(1)
        torch.cuda.synchronize()
        outs[name] = out.clone()
        ms = triton.testing.do_bench(lambda: go(programs), warmup=5, rep=50)
        print(f"{name}: {ms:.3f} ms for {programs} programs x {n} keys", flush=True)
    ref = outs["tl ahead"]
    for name in ("gluon single", "gluon ahead"):
        print(f"{name} == tl ahead: {torch.equal(outs[name], ref)} "
              f"(max |diff| {float((outs[name] - ref).abs().max()):.3g})", flush=True)


def main():
    from sm90_ptx import ptxas_usage
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write each variant's PTX here (a prefix)")
    ap.add_argument("--run", action="store_true", help="on a GPU: bits and times")
    ap.add_argument("--n", type=int, default=16384, help="keys a program walks (--run)")
    ap.add_argument("--programs", type=int, default=264, help="programs a launch (--run)")
    args = ap.parse_args()
    if args.run:
        run(args.n, args.programs)
        return
    loop = kernels()
    for ahead in (False, True):
        ptx = build(loop, ahead).asm["ptx"]
        if args.dump:
            open(f"{args.dump}gluon-{'ahead' if ahead else 'single'}.ptx", "w").write(ptx)
        waits = collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx))
        shapes = {w.split(".")[4]: ptx.count(w) for w in
                  sorted(set(re.findall(r"wgmma\.mma_async[\w.]*", ptx)))}
        print(f"gluon {'ahead' if ahead else 'single'}: waits {dict(waits)}, wgmma {shapes}, "
              f"{ptxas_usage(ptx)}", flush=True)


if __name__ == "__main__":
    main()
