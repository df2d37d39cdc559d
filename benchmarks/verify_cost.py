"""What a speculative round's verification costs on CUDA against a decode step (issue 17).

A verification block of 1 + k rows is an uncaptured chunk pass (backends/cuda/chunk_step.py),
a decode step one graph replay.  If the block is host-bound (~19 launches a layer from Python)
a round costs many decode steps, and speculation only pays when it settles more tokens per round
than that.  For each model shape (random weights, cuda_measure.build), a session at `context`
positions: the mean wall ms of a decode step, and of a round's verify-and-rollback
(`checkpoint`, `extend([t] + drafts)`, `rollback(keep=1)` -- what speculative_generate does),
per block size; the break-even tokens per round = round ms / decode ms.  Then greedy generation
end to end, plain against prompt-lookup speculation.

    PYTHONPATH=.:benchmarks python3 benchmarks/verify_cost.py [270m,1b] [2048]
"""
import sys
import time

import torch

from cuda_bench import SHAPES
from cuda_measure import rand_ids, round_session, sync


def mean_ms(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) * 1e3 / reps


def main():
    names = (sys.argv[1] if len(sys.argv) > 1 else "270m,1b").split(",")
    context = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    for name in names:
        shape = SHAPES[name]
        eng, s, block, decode = round_session(shape, context)
        step = mean_ms(decode)
        print(f"== {name} @{context}: a decode step (+ rollback) {step:.3f} ms", flush=True)
        for rows in (1, 2, 4, 8, 16):             # (an extend of 1: a chunk pass, not the graph)
            ms = mean_ms(lambda: block(rows))
            print(f"   block of {rows:2d} rows: {ms:.3f} ms = {ms / step:.1f} decode steps "
                  f"(speculation pays above that many tokens settled per round)", flush=True)
        # end to end: greedy generation, plain against prompt-lookup speculation (random weights:
        # what the drafts hit is the model's own repetition; rounds without drafts are plain steps)
        prompt = rand_ids(256, shape["vocab"], 9)
        for mode in ("plain", "spec", "plain", "spec"):
            st = {}
            kw = {"speculative": "prompt-lookup", "stats": st} if mode == "spec" else {}
            sync()
            t = time.perf_counter()
            out = list(eng.stream(prompt, max_tokens=128, **kw))
            sync()
            dt = time.perf_counter() - t
            print(f"   stream {mode:5s}: {len(out) / dt:7.1f} tok/s (prefill included) "
                  f"{ {k: st.get(k) for k in ('rounds', 'plain_steps', 'accepted')} if st else ''}",
                  flush=True)
        del eng, s
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
