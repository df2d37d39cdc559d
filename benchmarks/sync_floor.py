"""What a dependent stage costs on this GPU apart from its work: a PDL launch boundary in a graph
against a grid barrier inside one persistent kernel (CUDA; the measurement a megakernel's case
rests on, issue 17).

A *stage* is the decode step's dependency at one row: every program reads the whole vector the
stage before wrote (x, [N] float32, from the L2) and writes its R entries of the next one, so no
program can start before every program of the stage before has stored.  Two ways to wait:

    launches  one graph of S launches, programmatic dependent launch (the step's form): the
              wait is `griddepcontrol.wait` at a launch's top, the boundary is the hardware's
    barrier   ONE launch of G programs (all resident: G <= SMs) walking S stages; between two
              stages each program adds 1 to a counter (release, after a CTA barrier) and polls
              it (ld.acquire: every thread, or thread 0 then a CTA barrier) until it reads s x G

Each with or without weights (stage s reads its own [N, N] bf16 matrix, R rows a program,
y = w @ x as a float32 tree or as the tensor cores' k16 chain -- S x N x N x 2 bytes in all,
past the 50 MB L2 so they come from HBM) asked for AFTER the wait (`late`: what the step's
launches do), BEFORE it (`early`: the weights do not depend on x), or, in the barrier form, a
whole stage ahead (held in registers across the barrier: what only a persistent kernel can
do).  us a stage =
graph replay time / S.  Every variant's last vector is checked against the first variant's
(bitwise where the kernels share the arithmetic, else close: a race shows as a wrong vector).
`--after`: the early ask once more, right after a real projection as the step launches it
(the step's early asks lost where this chain of identical launches says they pay).

    PYTHONPATH=. python3 benchmarks/sync_floor.py [--n 1024 2048] [--stages 64] [--programs 128 32]
    PYTHONPATH=. python3 benchmarks/sync_floor.py --n --after 270m_gu 1b_gu   # after real launches
"""
import argparse

import torch
import triton
import triton.language as tl

from decode_attn_probe import graph_us         # us a captured call of fn, replayed


@triton.jit
def _stage(src, dst, w, rows, N: tl.constexpr, WK: tl.constexpr):
    """One stage's work for R rows: x = src[0:N] (past the L1: another SM wrote it), then
    y = w @ x -- WK 1: a float32 tree over N (tl.sum), WK 2: on the tensor cores, x as row 0 of
    16 (N / 16 dependent MMAs a column: dot_rows' chain) -- or, WK 0, sum(x) / N + row; y is
    stored to dst[rows]."""
    cols = tl.arange(0, N)
    x = tl.load(src + cols, cache_modifier=".cg")                      # [N] f32
    if WK == 2:
        first = tl.arange(0, 16)[:, None] == 0
        xb = tl.where(first, x[None, :], 0.0).to(tl.bfloat16)         # [16, N]
        y = tl.sum(tl.dot(xb, tl.trans(w)), axis=0)                    # [R]: row 0 + zeros
    elif WK == 1:
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)              # [R]
    else:
        y = tl.sum(x) * (1.0 / N) + rows.to(tl.float32) * 1e-3         # [R]
    tl.store(dst + rows, y)


@triton.jit
def _load_acquire(p):
    """ld.acquire.gpu of one int32: later reads see what the releases before it published."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [p],
                                     dtype=tl.int32, is_pure=False, pack=1)


# thread 0 spins on ld.acquire.gpu until *$1 >= $2; the others pass to the CTA barrier after it
# (labels inside braces are local to the block: the asm may be inlined often).  Shared with
# sync_pipe_probe.py's Gluon kernel.
SPIN_ASM = tl.constexpr(
    "{ .reg .pred q; .reg .b32 t, c; mov.u32 t, %tid.x; setp.ne.u32 q, t, 0; @q bra done_w;"
    " spin_w: ld.acquire.gpu.global.b32 c, [$1]; setp.lt.s32 q, c, $2; @q bra spin_w;"
    " done_w: mov.b32 $0, 0; }")


@triton.jit
def _spin_one(p, target):
    """SPIN_ASM: thread 0 waits for *p >= target."""
    return tl.inline_asm_elementwise(SPIN_ASM, "=r,l,r", [p, target], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _launch_kernel(X, Wt, s, N: tl.constexpr, R: tl.constexpr, WK: tl.constexpr,
                   EARLY: tl.constexpr, PDL: tl.constexpr):
    """Stage s as its own launch: x in X[s % 2], y to X[(s + 1) % 2]."""
    pid = tl.program_id(0)
    rows = pid * R + tl.arange(0, R)
    cols = tl.arange(0, N)
    w = rows                                    # replaced below where WK (unused otherwise)
    if WK and EARLY:
        w = tl.load(Wt + s * N * N + rows[:, None] * N + cols[None, :])
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if WK and not EARLY:
        w = tl.load(Wt + s * N * N + rows[:, None] * N + cols[None, :])
    _stage(X + (s % 2) * N, X + ((s + 1) % 2) * N, w, rows, N, WK)


@triton.jit
def _persist_kernel(X, Wt, CTR, S, G, N: tl.constexpr, R: tl.constexpr, WK: tl.constexpr,
                    EARLY: tl.constexpr, ONE: tl.constexpr):
    """S stages in one launch of G resident programs, a counter barrier between stages; ONE:
    thread 0 alone polls the counter (else every thread does).  EARLY: a stage's weights asked
    for after its wait (0), before it (1), or a whole stage ahead (2: stage s + 1's during
    stage s, held in registers across the barrier -- what only a persistent kernel can do)."""
    pid = tl.program_id(0)
    rows = pid * R + tl.arange(0, R)
    cols = tl.arange(0, N)
    w_next = rows
    if WK and EARLY == 2:
        w_next = tl.load(Wt + rows[:, None] * N + cols[None, :])          # stage 0's
    for s in range(S):
        w = rows
        if WK and EARLY == 2:
            w = w_next
            nxt = tl.minimum(s + 1, S - 1)                                 # (the last: again)
            w_next = tl.load(Wt + nxt * N * N + rows[:, None] * N + cols[None, :])
        if WK and EARLY == 1:                   # asked for before the wait: no dependency
            w = tl.load(Wt + s * N * N + rows[:, None] * N + cols[None, :])
        if s > 0:
            target = s * G
            if ONE:
                _spin_one(CTR, target)
            else:
                c = _load_acquire(CTR)
                while c < target:
                    c = _load_acquire(CTR)
            tl.debug_barrier()                  # the other threads read x after the acquire
        if WK and EARLY == 0:
            w = tl.load(Wt + s * N * N + rows[:, None] * N + cols[None, :])
        _stage(X + (s % 2) * N, X + ((s + 1) % 2) * N, w, rows, N, WK)
        tl.debug_barrier()                      # every thread's stores before the one release
        tl.atomic_add(CTR, 1, sem="release", scope="gpu")


def stage_row(step, x, stages: int, replays: int) -> tuple[float, torch.Tensor]:
    """us a stage of `step` (S stages captured once, replayed) and the last vector it leaves
    (x[S % 2]: the stages alternate between x's two rows)."""
    us = graph_us(step, reps=1, replays=replays) / stages
    step()
    torch.cuda.synchronize()
    return us, x[stages % 2].clone()


def vector_check(last: torch.Tensor, ref: torch.Tensor) -> str:
    """"equal", else the relative error; past 1e-3 flagged "RACE?" (another summation order of
    the same stages lands far closer)."""
    if torch.equal(last, ref):
        return "equal"
    err = ((last - ref).abs().max() / ref.abs().max()).item()
    return f"rel err {err:.1e}" + (" (RACE?)" if err > 1e-3 else "")


def run(n: int, stages: int, warps: int, replays: int, g: int) -> list[tuple[str, float, str]]:
    """The variants at width n with g programs (R = n / g rows a program; the MMA rows: 16 a
    program, n / 16 programs, whatever g says -- an MMA's n is at least 16 -- and only to
    n = 1,024: past it the operands spill)."""
    dev = torch.device("cuda")
    r = n // g                                  # warps 0: 4 to 16, <= 32 weights a thread
    x0 = torch.randn(n, device=dev)
    wt = (torch.randn(stages, n, n, device=dev) / n ** 0.5).to(torch.bfloat16)
    ctr = torch.zeros(4, dtype=torch.int32, device=dev)
    x = torch.empty(2, n, device=dev)
    out, first = [], {}
    for name, wk, early, mode in (("launches, no PDL", False, False, "nopdl"),
                                  ("launches, PDL", False, False, "pdl"),
                                  ("barrier, every thread polls", False, False, "persist"),
                                  ("barrier, thread 0 polls", False, False, "one"),
                                  ("launches, PDL, weights late", True, False, "pdl"),
                                  ("launches, PDL, weights early", True, True, "pdl"),
                                  ("barrier, weights late", True, False, "persist"),
                                  ("barrier, weights early", True, True, "persist"),
                                  ("barrier, thread 0 polls, weights early", True, True, "one"),
                                  ("barrier, weights a stage ahead", True, 2, "persist"),
                                  ("launches, PDL, weights late, MMA", 2, False, "pdl"),
                                  ("launches, PDL, weights early, MMA", 2, True, "pdl"),
                                  ("barrier, weights early, MMA", 2, True, "persist"),
                                  ("barrier, weights a stage ahead, MMA", 2, 2, "persist")):
        if wk == 2 and n > 1024:                # x [16, N] and w [16, N] in registers spill
            continue
        gg, rr = (n // 16, 16) if wk == 2 else (g, r)
        ww = warps or min(16, max(4, rr * n // 4096))

        def step():
            x[0].copy_(x0)
            if mode in ("persist", "one"):
                ctr.zero_()
                _persist_kernel[(gg,)](x, wt, ctr, stages, gg, N=n, R=rr, WK=int(wk),
                                       EARLY=int(early), ONE=mode == "one", num_warps=ww)
            else:
                for s in range(stages):
                    _launch_kernel[(gg,)](x, wt, s, N=n, R=rr, WK=int(wk), EARLY=early,
                                          PDL=mode == "pdl", num_warps=ww,
                                          launch_pdl=mode == "pdl")
        us, last = stage_row(step, x, stages, replays)
        out.append((name, us, vector_check(last, first.setdefault(int(wk), last))))
    return out


# real producers for --after: (n, k, glu) of a decode projection (dot_tiles_graph.SHAPES)
PRODUCERS = {"270m_gu": (2048, 640, True), "1b_gu": (6912, 1152, True),
             "1b_qkv": (1536, 1152, False), "4b_gu": (10240, 2560, True)}


def run_after(name: str, n: int, stages: int, warps: int, replays: int, g: int):
    """The open question of the probe against the step: does a small stage's early ask still
    pay right after a real projection (dot_rows, as the step launches it: PDL on, its weights
    from HBM) whose programs may fill the SMs?  Rows: the producer alone, then producer +
    consumer (N = n, g programs) late and early; the consumer's cost = the pair less the
    producer alone."""
    from muser.backends.cuda.triton_dot import dot_rows
    dev = torch.device("cuda")
    pn, pk, glu = PRODUCERS[name]
    per = pn * (2 if glu else 1) * pk * 2
    copies = max(2, (256 << 20) // per)
    pw = [torch.randn(pn * (2 if glu else 1), pk, device=dev, dtype=torch.bfloat16) * 0.02
          for _ in range(copies)]
    px = torch.randn(1, pk, device=dev, dtype=torch.bfloat16)
    r = n // g
    ww = warps or min(16, max(4, r * n // 4096))
    wt = (torch.randn(stages, n, n, device=dev) / n ** 0.5).to(torch.bfloat16)
    x = torch.randn(2, n, device=dev)
    out = []
    for label, consumer, early in (("producer alone", False, False),
                                   ("producer + consumer, weights late", True, False),
                                   ("producer + consumer, weights early", True, True)):
        def step():
            for s in range(stages):
                dot_rows(px, pw[s % copies], glu=glu, gelu=glu, pdl=True)
                if consumer:
                    _launch_kernel[(g,)](x, wt, s, N=n, R=r, WK=1, EARLY=early, PDL=True,
                                         num_warps=ww, launch_pdl=True)
        out.append((label, graph_us(step, reps=1, replays=replays) / stages))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=[1024, 2048])
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--warps", type=int, default=0, help="0: 4 to 16, <= 32 weights a thread")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--after", nargs="*", default=[], choices=sorted(PRODUCERS),
                    help="also: a consumer stage after each of these real projections")
    ap.add_argument("--programs", type=int, nargs="+", default=[0],
                    help="programs a stage (0: the largest power of two <= the SMs; all must be "
                         "resident at once for the barrier)")
    a = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()} ({sms} SMs); {a.stages} stages")
    for g in a.programs:
        g = g or 1 << (sms.bit_length() - 1)
        assert g <= sms, f"{g} programs: the barrier needs them all resident ({sms} SMs)"
        for n in a.n:
            mb = n * n * 2 / 2 ** 20
            print(f"\n## N = {n}, {g} programs ({n // g} rows each; "
                  f"weights: {mb:.1f} MB a stage)\n")
            print("| how a stage waits | us a stage | last vector |\n|---|---:|---|")
            for name, us, check in run(n, a.stages, a.warps, a.replays, g):
                print(f"| {name} | {us:.2f} | {check} |", flush=True)
    g = 1 << (sms.bit_length() - 1)
    for name in a.after:
        print(f"\n## after {name} (dot_rows, PDL; consumer N = 1,024, {g} programs)\n")
        print("| stage pair | us a pair |\n|---|---:|")
        for label, us in run_after(name, 1024, a.stages, a.warps, a.replays, g):
            print(f"| {label} | {us:.2f} |", flush=True)


if __name__ == "__main__":
    main()
