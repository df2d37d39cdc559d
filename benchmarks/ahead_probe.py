"""The next key tile's scores issued before this tile's softmax: does Triton overlap them? (sm_90)

FA3's intra-warpgroup overlap: while the CUDA cores run tile i's softmax, the tensor cores
already compute tile i + 1's q k^T.  The exact chunk kernel's wgmmas are synchronous a tile
(Nsight Compute, thirtieth session: QK waited for at once, the ones dot and p @ V too), so a
warpgroup's tensor and CUDA-core work alternate.  This probe compiles the plain online-softmax
loop at the wide route's shape (128 slots, 8 warps, D 256, 128 value columns, 32-key tiles)
two ways -- `single` (QK, softmax, p @ V a trip, as the kernel does: pair_split_probe's
single-tile loop, ARITHMETIC 2's softmax -- the waits do not follow it) and `ahead` (the scores
of tile i + 1 computed at the end of trip i and carried: the same dots, the same sums, so the
same bits) -- and prints, for each: the wgmma wait counts in the loop (`wgmma.wait_group N`:
N > 0 leaves N groups in flight, the overlap), the wgmma shapes, ptxas' registers / spills.

Thirty-first session (Triton 3.6, this machine): **no overlap** -- `ahead` waits for the next
tile's scores right after issuing them (`wgmma.wait_group 0` before this tile's first ex2), as
`single` does: 4 waits, all 0, and 165 registers against 130 for the carried scores.  Triton's
`tl.dot` in a loop is synchronous unless it chains onto its own accumulator.  The overlap
needs Gluon (`triton.experimental.gluon`, in the 3.6 wheel: `warpgroup_mma(..., is_async=True)`
+ `warpgroup_mma_wait(1, deps)`) or CUDA C++ (benchmarks/NOTES.md, thirty-first session).

    PYTHONPATH=/tmp/t36:benchmarks:. python3 benchmarks/ahead_probe.py [--warps 8]
"""
import argparse
import collections
import re

import pair_split_probe
from pair_split_probe import build


def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def fold(sc, v, m, l, acc, ones):
        """tile_step's unmasked body on given scores (triton_attn.py, ARITHMETIC 3)."""
        m_new = tl.maximum(m, tl.max(sc, 1) * 0.0625)
        alpha = tl.exp(m - m_new)
        p = tl.exp2(tl.fma(sc, 0.0625 * 1.4426950408889634,
                           (-(m_new * 1.4426950408889634))[:, None])).to(v.dtype)
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
        j = tl.arange(0, BN)                       # PAIR is unused: build()'s signature
        sc = tl.dot(q, tl.trans(tl.load(K + j[:, None] * D + d[None, :])), input_precision="ieee")
        for st in range(0, n, BN):
            j = st + tl.arange(0, BN)
            nx = tl.minimum(st + BN, n - BN) + tl.arange(0, BN)        # the last trip: again
            k = tl.load(K + nx[:, None] * D + d[None, :])
            nsc = tl.dot(q, tl.trans(k), input_precision="ieee")
            v = tl.load(V + j[:, None] * D + dv[None, :])
            m, l, acc = fold(sc, v, m, l, acc, ones)
            sc = nsc
        tl.store(O + i[:, None] * DPW + dv[None, :], acc / l[:, None])

    return loop


def summary(ptx: str) -> str:
    """The wgmma waits (`wait_group N`: N groups left in flight), the wgmma shapes and ptxas'
    registers / spills / serialization of one PTX."""
    from sm90_ptx import ptxas_usage
    waits = collections.Counter(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx))
    shapes = {w.split(".")[4]: ptx.count(w) for w in
              sorted(set(re.findall(r"wgmma\.mma_async[\w.]*", ptx)))}
    return f"waits {dict(waits)}, wgmma {shapes}, {ptxas_usage(ptx)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--dump", help="write each variant's PTX here (a prefix)")
    args = ap.parse_args()
    loops = {False: pair_split_probe.kernels(), True: kernels()}   # single: its PAIR False
    for ahead in (False, True):
        c = build(loops[ahead], False, args.warps)
        ptx = c.asm["ptx"]
        if args.dump:
            open(f"{args.dump}{'ahead' if ahead else 'single'}.ptx", "w").write(ptx)
        print(f"{'ahead' if ahead else 'single'}: {summary(ptx)}", flush=True)


if __name__ == "__main__":
    main()
