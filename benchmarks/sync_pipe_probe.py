"""The one persistent form `sync_floor.py` has not probed: weights streamed through a ring of
shared-memory buffers by cp.async, kept NBUF - 1 tiles ahead ACROSS the grid barrier -- a loader
that never stops at an op boundary, which is what Hazy Research's megakernel does and what its
case on this GPU rests on (issue 17; benchmarks/NOTES.md, forty-fourth session).

sync_floor's persistent rows ask for a stage's weights at the stage's start, or a whole stage
ahead held in registers; neither beat a chain of PDL launches asking early (H100: 8 MB a stage
4.26 / 4.53 against 3.88 us; the bus floor ~2.5).  Triton's own pipeliner cannot build the
streamed form: with the barrier's spin (inline asm, a CTA barrier in an `if`) in the loop it
pipelines nothing, and with x loaded by tl.load it would prefetch x across the wait
(forty-fourth session, compiled for sm_90).  So this kernel is Gluon, explicit:

    it = 0 .. S * KT - 1 (KT = N / BK tiles a stage), tile `it` in buffer it % NBUF:
      issue tile it + NBUF - 1's cp.async (into the buffer tile it - 1 left), commit
      first tile of a stage s > 0: thread 0 spins on the counter (ld.acquire), CTA barrier
      x's BK entries (after the wait); cp.async.wait_group(NBUF - 1): tile it is in
      acc += w . x over the tile (float32 tree); last tile: store y, CTA barrier, release

Each thread copies and reads the same elements (one layout for both), so a buffer is refilled
only by the thread that read it.  Rows: the same stages as sync_floor (stage s: its own [N, N]
bf16 matrix, R rows a program, y = w @ x), "launches, PDL, weights early" and "barrier, weights
early" from sync_floor beside NBUF 2 / 4 / 8; us a stage = graph replay / S; each last vector
against the launches' (another summation order: close, "RACE?" past 1e-3).

    PYTHONPATH=benchmarks:. python3 benchmarks/sync_pipe_probe.py [--n 1024 2048]   # a GPU
    PYTHONPATH=benchmarks:. python3 benchmarks/sync_pipe_probe.py --compile          # sm_90 PTX
"""
import argparse

# (buffers, keys a tile) of the streamed rows: Gluon puts a CTA barrier before each refill
# (the buffer's last readers) and after each wait (the copies' other readers) -- two bar.syncs a
# tile, so larger tiles pay fewer (sm_90 PTX, forty-fourth session)
PIPES = ((2, 128), (4, 128), (8, 128), (2, 512), (4, 512))


def kernels():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

    from sync_floor import SPIN_ASM

    @gluon.jit
    def spin(p, target):
        """Thread 0 spins on ld.acquire.gpu until *p >= target (the others pass; the CTA barrier
        after the call holds them)."""
        return gl.inline_asm_elementwise(SPIN_ASM, "=r,l,r", [p, target], dtype=gl.int32,
                                         is_pure=False, pack=1)

    @gluon.jit
    def issue(Wt, w_s, t, total, rows, ks, N: gl.constexpr, KT: gl.constexpr,
              NBUF: gl.constexpr, BK: gl.constexpr):
        """cp.async of tile t (clamped to the last: the loop's tail re-reads it harmlessly)
        into buffer t % NBUF, one commit group."""
        t = gl.minimum(t, total - 1)
        s = t // KT
        k0 = (t - s * KT) * BK
        cp.async_copy_global_to_shared(
            w_s.index(t % NBUF), Wt + s.to(gl.int64) * N * N + rows[:, None] * N + k0 + ks[None, :])
        cp.commit_group()

    @gluon.jit
    def pipe_kernel(X, Wt, CTR, S, G, N: gl.constexpr, R: gl.constexpr, NBUF: gl.constexpr,
                    BK: gl.constexpr):
        # [R, BK] tiles: 8 bf16 (16 bytes, one cp.async) a thread, 16 threads across a row
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        KT: gl.constexpr = N // BK
        pid = gl.program_id(0)
        rows = pid * R + gl.arange(0, R, layout=gl.SliceLayout(1, ld))
        ks = gl.arange(0, BK, layout=gl.SliceLayout(0, ld))
        w_s = gl.allocate_shared_memory(gl.bfloat16, [NBUF, R, BK], gl.SwizzledSharedLayout(
            vec=1, per_phase=1, max_phase=1, order=[1, 0]))
        total = S * KT
        for t in gl.static_range(NBUF - 1):
            issue(Wt, w_s, t, total, rows, ks, N, KT, NBUF, BK)
        acc = gl.zeros([R], gl.float32, layout=gl.SliceLayout(1, ld))
        for it in range(total):
            issue(Wt, w_s, it + NBUF - 1, total, rows, ks, N, KT, NBUF, BK)
            s = it // KT
            kt = it - s * KT
            if (kt == 0) & (s > 0):
                spin(CTR, s * G)
                gl.thread_barrier()             # the other threads read x after the acquire
            x = gl.load(X + (s % 2) * N + kt * BK + ks, cache_modifier=".cg")     # [BK] f32
            cp.wait_group(NBUF - 1)             # tile it is in (this thread's copies)
            w = w_s.index(it % NBUF).load(ld)                                    # [R, BK]
            acc += gl.sum(w.to(gl.float32) * x[None, :], axis=1)
            if kt == KT - 1:
                gl.store(X + ((s + 1) % 2) * N + rows, acc)
                acc = gl.zeros([R], gl.float32, layout=gl.SliceLayout(1, ld))
                gl.thread_barrier()             # every thread's stores before the one release
                gl.atomic_add(CTR, 1, sem="release", scope="gpu")

    return pipe_kernel


def compile_sm90(n: int, r: int, nbuf: int, bk: int) -> str:
    """The kernel's PTX for sm_90, no GPU needed."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    k = kernels()
    names = list(inspect.signature(k.fn).parameters)
    consts = dict(N=n, R=r, NBUF=nbuf, BK=bk)
    sig = {"X": "*fp32", "Wt": "*bf16", "CTR": "*i32", "S": "i32", "G": "i32",
           **{c: "constexpr" for c in consts}}
    attrs = {(names.index(x),): [["tt.divisibility", 16]] for x in ("X", "Wt", "CTR")}
    src = GluonASTSource(fn=k, signature=sig, attrs=attrs,
                         constexprs={(names.index(c),): v for c, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4}).asm["ptx"]


def run(n: int, stages: int, replays: int, g: int) -> list[tuple[str, float, str]]:
    import torch

    import sync_floor as sf
    dev = torch.device("cuda")
    r = n // g
    ww = min(16, max(4, r * n // 4096))        # sync_floor's warps for its rows
    x0 = torch.randn(n, device=dev)
    wt = (torch.randn(stages, n, n, device=dev) / n ** 0.5).to(torch.bfloat16)
    ctr = torch.zeros(4, dtype=torch.int32, device=dev)
    x = torch.empty(2, n, device=dev)
    pipe = kernels()
    out, ref = [], None
    rows = [("launches, PDL, weights early (sync_floor)", "pdl", (0, 0)),
            ("barrier, weights early (sync_floor)", "persist", (0, 0))]
    rows += [(f"barrier, weights streamed {b - 1} tiles of {k} keys ahead", "pipe", (b, k))
             for b, k in PIPES if n % k == 0]
    for name, mode, (nbuf, bk) in rows:
        def step():
            x[0].copy_(x0)
            if mode == "pipe":
                ctr.zero_()
                pipe[(g,)](x, wt, ctr, stages, g, N=n, R=r, NBUF=nbuf, BK=bk, num_warps=4)
            elif mode == "persist":
                ctr.zero_()
                sf._persist_kernel[(g,)](x, wt, ctr, stages, g, N=n, R=r, WK=1, EARLY=1,
                                         ONE=False, num_warps=ww)
            else:
                for s in range(stages):
                    sf._launch_kernel[(g,)](x, wt, s, N=n, R=r, WK=1, EARLY=True, PDL=True,
                                            num_warps=ww, launch_pdl=True)
        us, last = sf.stage_row(step, x, stages, replays)
        ref = last if ref is None else ref
        out.append((name, us, sf.vector_check(last, ref)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=[1024, 2048])
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--programs", type=int, default=0,
                    help="0: the largest power of two <= the SMs (all resident: the barrier)")
    ap.add_argument("--compile", action="store_true", help="sm_90 PTX summary, no GPU")
    a = ap.parse_args()
    if a.compile:
        import re
        for n, r, nbuf, bk in ((1024, 8, 4, 128), (2048, 16, 4, 128), (2048, 16, 8, 128),
                               (2048, 16, 4, 512)):
            ptx = compile_sm90(n, r, nbuf, bk)
            copies = len(re.findall(r"cp.async.c", ptx))
            print(f"N {n}, R {r}, NBUF {nbuf}, BK {bk}: cp.async {copies}, "
                  f"wait_group {ptx.count('cp.async.wait_group')}, bar.sync "
                  f"{ptx.count('bar.sync')}, ld.acquire {ptx.count('ld.acquire')}, "
                  f"atom {ptx.count('atom.')}, {len(ptx.splitlines())} lines")
        return
    import torch
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = a.programs or 1 << (sms.bit_length() - 1)
    print(f"# {torch.cuda.get_device_name()} ({sms} SMs); {a.stages} stages, {g} programs")
    for n in a.n:
        print(f"\n## N = {n} ({n // g} rows a program; weights {n * n * 2 / 2 ** 20:.1f} MB a "
              f"stage)\n\n| how a stage waits | us a stage | last vector |\n|---|---:|---|")
        for name, us, check in run(n, a.stages, a.replays, g):
            print(f"| {name} | {us:.2f} | {check} |", flush=True)


if __name__ == "__main__":
    main()
