"""The host's share of a batched CUDA decode step, measured on any machine (no GPU).

A 16-session step of the 1B's geometry spends ~0.4 ms of host time (H200 host, tenth session:
1.99 ms wall against 1.55 ms of bare replay) that nothing overlaps: the plane bookkeeping of
every session and plane group (`GraphRunner.decode`), the engine's checks around it.  This
script runs exactly that code -- `Session._validate` and `GraphRunner.decode` with capture off
-- over a tiny model of the 1B's depth (26 layers, window 512, 16 sessions at 2,048 tokens),
with the kernels replaced by a step that returns a logits buffer.  Best of several rounds.

    PYTHONPATH=. python3 benchmarks/host_step.py [--batch 16] [--layers 26] [--prof] [--greedy]

`--greedy`: the host's share of a pipelined greedy step instead (`Engine.decode_greedy`'s
`GreedySteps`, backends/cuda/greedy.py: launch, collect, the run's bookkeeping) -- the time the
host needs per step, which must stay under the GPU's step for the pipeline to hide it.

Before / after a change, in one run: `git archive OLD muser | tar x -C .prev` and run it with
PYTHONPATH=.prev, then with PYTHONPATH=. (benchmarks/RESULTS.md).
"""
import argparse
import cProfile
import pstats
import time

import torch

from muser.backends.cuda.graph import GraphRunner
from muser.testing import tiny_model


class NullStep:
    """Stands in for DecodeStep: the kernels' time is not the question here.  No fused pick:
    the greedy graph body then picks through torch (greedy_rows), as the host tests do."""

    fused_pick = False

    def __init__(self, batch, vocab):
        self.out = torch.zeros(batch, vocab)

    def workspace(self, batch):
        return None

    def run(self, packed, tables, ws):
        return self.out[:tables.shape[1]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prof", action="store_true", help="also print a cProfile of 100 steps")
    ap.add_argument("--greedy", action="store_true",
                    help="a pipelined greedy run's host share per step (GreedySteps)")
    args = ap.parse_args()
    eng = tiny_model("gemma3", layers=args.layers, window=512, tokenizer=False,
                     max_context=args.context + args.rounds * args.steps + 512,
                     hidden=64, heads=4, kv_heads=1, head_dim=16)
    sessions = []
    for _ in range(args.batch):
        s = eng.new_session()
        s.prefill([5 + (j % 50) for j in range(args.context)], chunk_size=args.context)
        sessions.append(s)
    runner = GraphRunner(eng, capture=False)
    runner.step = NullStep(args.batch, eng.spec.vocab_size)

    def step(toks):                      # Engine.forward's checks, then the runner's decode
        chunks = [s._validate([t]) for s, t in zip(sessions, toks)]
        return runner.decode(sessions, [c[0] for c in chunks])

    toks = [7] * args.batch
    if args.greedy:
        from muser.backends.cuda.greedy import GreedySteps
        from muser.backends.greedy import Budget, run_steps

        def steps_of(n):                 # a greedy run of n steps, the host one step ahead
            run_steps(GreedySteps(runner), sessions, Budget.check(eng, sessions, toks, n, ()))

        def step(toks, n=args.steps):    # noqa: F811 -- timed per run of n steps, below
            steps_of(n)
        args.steps, per_call = 1, args.steps
    else:
        per_call = 1
    for _ in range(5 if not args.greedy else 1):
        step(toks)
    best = None
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(toks)
        dt = (time.perf_counter() - t0) / (args.steps * per_call)
        best = dt if best is None else min(best, dt)
    what = "pipelined greedy step" if args.greedy else "host step"
    print(f"{what}: {args.batch} sessions x {args.layers} layers: {best * 1e6:.1f} us "
          f"(best of {args.rounds} x {args.steps * per_call} steps)")
    if args.prof:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(100 if not args.greedy else 1):     # greedy: one run of --steps steps
            step(toks)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
