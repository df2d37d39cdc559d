"""Where a short prefill's time goes on CUDA: host or GPU (issue 17 item 4, issue 12's 512 row).

For each model shape (random weights, cuda_measure.build): a 512-token prefill, warmed, then
timed 5 times (wall ms each: the spread shows the bimodality), its kernel time from the
profiler (GPU busy ms), and a cProfile of one more prefill: the host functions by own time.
If wall >> kernel time, the chunk pass is host-bound and the cure is fewer launches or a
captured graph, not faster kernels.  Then the same prefills with the chunk graphs on
(MUSER_CHUNK_GRAPHS=on: one session's chunk as one replay, backends/cuda/chunk_graph.py): wall
ms and whether the logits of the two modes are bitwise equal.

    PYTHONPATH=.:benchmarks python3 benchmarks/prefill_host_probe.py [270m,1b] [512]
"""
import os
import cProfile
import io
import pstats
import sys
import time

import torch

import muser
from cuda_bench import SHAPES
from cuda_measure import build, rand_ids, reserve, sync, top_kernels


def one(engine, n, vocab, seed):
    s = engine.new_session()
    reserve(s, n)
    ids = rand_ids(n, vocab, seed)
    sync()
    t0 = time.perf_counter()
    s.prefill(ids)
    sync()
    return (time.perf_counter() - t0) * 1e3, s, ids


def main():
    from torch.profiler import ProfilerActivity, profile
    names = (sys.argv[1] if len(sys.argv) > 1 else "270m,1b").split(",")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    for name in names:
        shape = SHAPES[name]
        _, path = build(shape, max(4096, n + 1024))
        eng = muser.load(path, device="cuda", dtype="bfloat16", progress=False)
        vocab = shape["vocab"]
        for r in range(2):
            one(eng, n, vocab, r)
        walls = [round(one(eng, n, vocab, 10 + r)[0], 2) for r in range(5)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            wall = one(eng, n, vocab, 20)[0]
        total, rows = top_kernels(prof, 1, 1e3, 60)
        launches = sum(int(c) for _, c, _ in rows)
        print(f"== {name} prefill {n}: wall ms {walls}  (profiled {wall:.1f}); kernel ms {total:.2f} "
              f"in {launches} launches; tok/s at best wall {n / min(walls) * 1e3:,.0f}", flush=True)
        for k, c, t in rows[:10]:
            print(f"   {k[:60]:60s} {int(c):5d} {t:8.3f} ms")
        pr = cProfile.Profile()
        pr.enable()
        one(eng, n, vocab, 30)
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(22)
        print("\n".join(buf.getvalue().splitlines()[:40]), flush=True)
        if n <= 2048:                       # prompt graphs: chunks of <= 2,048 rows only
            graphs(eng, n, vocab)
        del eng
        torch.cuda.empty_cache()


def graphs(eng, n, vocab):
    """Wall ms of the prefill with the prompt graphs off and on; logits bitwise equal?"""
    from muser.env import read
    out = {}
    for mode in ("off", "on"):
        os.environ["MUSER_CHUNK_GRAPHS"] = mode
        eng.backend.reset_runner(read())
        for r in range(2):
            one(eng, n, vocab, r)                     # warm: compile, capture
        walls = [round(one(eng, n, vocab, 10 + r)[0], 2) for r in range(5)]
        s = eng.new_session()
        logits = s.prefill(rand_ids(n, vocab, 40))
        out[mode] = (walls, logits)
    prompts = eng.backend.runner(eng).graphs
    same = torch.equal(torch.as_tensor(out["off"][1]), torch.as_tensor(out["on"][1]))
    print(f"   chunk graphs: off wall ms {out['off'][0]}; on wall ms {out['on'][0]} "
          f"(tok/s at best {n / min(out['on'][0]) * 1e3:,.0f}); logits bitwise equal: {same}; "
          f"stats {prompts.stats if prompts else None} failed {prompts.failed if prompts else None}",
          flush=True)
    os.environ.pop("MUSER_CHUNK_GRAPHS")
    eng.backend.reset_runner(read())


if __name__ == "__main__":
    main()
