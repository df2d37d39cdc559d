"""Where a CUDA round's host time goes (issue 17): cProfile of the Python around the kernels.

A verification block (checkpoint, extend 1 + k rows, rollback) costs ~6 ms on the 1B against
~1.5 ms of graph replay; a 16-session decode step 1.9 ms against ~1.3 for one.  This prints,
for the 1B shape at `context`: the wall ms of each, the top functions by own time (tottime) and
by cumulative time, the kernel breakdown of the 16-session step (torch.profiler), and the time
to first token of a 512-token prompt.

    PYTHONPATH=.:benchmarks python3 benchmarks/host_profile.py [1b] [2048] [rows]
"""
import cProfile
import io
import pstats
import sys
import time

from cuda_bench import SHAPES
from cuda_measure import muser_batch, muser_ttft, rand_ids, reserve, round_session, sync, \
    top_kernels


def profiled(label, fn, reps=30):
    for _ in range(3):
        fn()
    sync()
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    for _ in range(reps):
        fn()
    sync()
    pr.disable()
    ms = (time.perf_counter() - t) * 1e3 / reps
    print(f"== {label}: {ms:.3f} ms a round under cProfile", flush=True)
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats(key).print_stats(22)
        lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-23:]
        print(f"-- by {key} (per {reps} rounds)\n" + "\n".join(lines), flush=True)


def kernels(label, fn, reps=10):
    """The GPU side of the same round: kernel time per round and the top kernels."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        sync()
    total, rows = top_kernels(prof, reps, 1.0, 60)
    print(f"== {label}: {total:.1f} us of kernels a round", flush=True)
    for n, c, t in rows[:12]:
        print(f"   {t:8.1f} us {c:6.1f}x  {n}", flush=True)


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "1b"
    context = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    shape = SHAPES[name]
    eng, s, block_of, decode = round_session(shape, context)
    kernels(f"{name} decode step + rollback", decode)
    for r in (1, rows):
        kernels(f"{name} verification block of {r} rows", lambda r=r: block_of(r))
    profiled(f"{name} decode step + rollback", decode)
    profiled(f"{name} verification block of {rows} rows", lambda: block_of(rows))
    ttft = muser_ttft(eng, 512, shape["vocab"])
    print(f"== {name} first token of a 512-token prompt: {ttft * 1e3:.2f} ms", flush=True)
    tps, step, bare, prof = muser_batch(eng, 16, context, 32, shape["vocab"], prof=True)
    print(f"== {name} 16 sessions @{context}: {tps:,.0f} tok/s, step {step * 1e3:.3f} ms, "
          f"bare replay {bare * 1e3:.3f} ms; {prof[0]} us of kernels a step", flush=True)
    for n, c, t in prof[1]:
        print(f"   {t:8.1f} us {c:6.1f}x  {n}", flush=True)
    sessions = [eng.new_session() for _ in range(16)]
    for i, x in enumerate(sessions):
        reserve(x, context + 64)
        x.prefill(rand_ids(context, shape["vocab"], 100 + i), chunk_size=4096)
    toks = [5] * 16
    profiled(f"{name} 16-session decode step",
             lambda: eng.decode_batch(sessions, toks).argmax(-1).tolist())


if __name__ == "__main__":
    main()
