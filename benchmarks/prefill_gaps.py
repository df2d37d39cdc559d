"""Where the GPU waits in a long prefill: the gaps between its kernels.  (issue 12, 16k rule)

The 1B's 16k prefill: 66.4 ms of kernels in 70.9 ms of wall (twenty-seventh session).  This
prints, for one n-token prefill (CUDA, random weights, cuda_measure.build): the host's time to
enqueue it (prefill returned, nothing waited for) against its wall, the idle time before the
first kernel, between kernels (sum, count of gaps over 5 us) and after the last one, and the
largest gaps with the kernels on either side -- so a gap can be read as the host's (a sync, a
table built, a descriptor encoded) or the queue's.

    PYTHONPATH=.:benchmarks python3 benchmarks/prefill_gaps.py [--models 1b] [--n 16384] [--chunk N]
"""
import argparse
import time

import torch

from cuda_bench import SHAPES
from cuda_measure import build, rand_ids, reserve, sync


def gaps(engine, n, vocab, chunk):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    s = engine.new_session()
    reserve(s, n)
    ids = rand_ids(n, vocab, 13)
    sync()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        s.prefill(ids, chunk_size=chunk)
        sync()
        wall = (time.perf_counter() - t0) * 1e3
    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    cpu = [e for e in prof.events() if e.device_type == DeviceType.CPU]
    t_first = min(e.time_range.start for e in cpu) if cpu else evs[0].time_range.start
    spans, end = [], evs[0].time_range.end
    for a, b in zip(evs, evs[1:]):
        end = max(end, a.time_range.end)
        if b.time_range.start > end:
            spans.append((b.time_range.start - end, a.name, b.name))
    idle = sum(g for g, _, _ in spans) / 1e3
    busy = (max(e.time_range.end for e in evs) - evs[0].time_range.start) / 1e3
    print(f"  wall {wall:.1f} ms; first kernel {(evs[0].time_range.start - t_first) / 1e3:.2f} ms "
          f"after the first host op; first to last kernel {busy:.1f} ms, of it idle {idle:.2f} ms "
          f"in {sum(g > 5 for g, _, _ in spans)} gaps over 5 us ({len(evs)} kernels)", flush=True)
    for g, a, b in sorted(spans, reverse=True)[:12]:
        print(f"    {g:8.1f} us  after {a[:40]}  before {b[:40]}", flush=True)


def host_ms(engine, n, vocab, chunk):
    """(enqueue ms, wall ms): prefill returned without waiting, then the GPU waited for."""
    best = None
    for r in range(3):
        s = engine.new_session()
        reserve(s, n)
        ids = rand_ids(n, vocab, 21 + r)
        sync()
        t0 = time.perf_counter()
        s.prefill(ids, chunk_size=chunk)
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        if r:
            cur = ((t1 - t0) * 1e3, (t2 - t0) * 1e3)
            best = cur if best is None or cur[1] < best[1] else best
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1b")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--chunk", type=int, default=None)
    args = ap.parse_args()
    import muser
    for name in args.models.split(","):
        shape = SHAPES[name]
        _, path = build(shape, args.n + 1024)
        eng = muser.load(path, device="cuda", dtype="bfloat16", progress=False,
                         max_context=args.n + 1024)
        enq, wall = host_ms(eng, args.n, shape["vocab"], args.chunk)
        print(f"{name} {args.n}-token prefill (chunks {args.chunk}): host enqueue {enq:.1f} ms, "
              f"wall {wall:.1f} ms ({args.n / wall * 1e3:,.0f} tok/s)", flush=True)
        gaps(eng, args.n, shape["vocab"], args.chunk)


if __name__ == "__main__":
    main()
