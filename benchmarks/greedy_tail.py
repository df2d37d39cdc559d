"""What a pipelined greedy step adds to its graph, piece by piece (CUDA, one process).

16 sessions at 2k on a random-weight shape (cuda_bench.SHAPES), one `decode_greedy` run to
capture the greedy graph, then the same step enqueued back to back in six ways, each timed on
the GPU with events (no host wait inside a loop, so the host's share is not in the numbers):

    plain        the plain step's graph (logits out): exact_ab's "bare"
    graph        the greedy graph alone (turn 0's: ids from res[1], picking head, fold)
    +up          graph, after this step's positions / metas copy up on the same stream
    +up+down     ... and the picks' copy down after it (today's stream: greedy.py `_replay`)
    side         graph on the main stream; the copies on two more streams, ordered by events
                 (inputs double-buffered: the upload goes to a scratch buffer a turn)
    run          decode_greedy itself (wall clock, host included)

    PYTHONPATH=. python3 benchmarks/greedy_tail.py [--models 1b,270m] [--steps 128]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def measure(eng, name, vocab, steps, batch):
    from cuda_measure import muser_batch, muser_greedy, timed
    muser_batch(eng, batch, 2048, 4, vocab)                 # captures the plain step's graph
    tps, ms = muser_greedy(eng, batch, 2048, steps, vocab)
    runner = eng.decode_runner()
    entry = runner.entries[batch]
    g = entry.greedy
    main = torch.cuda.current_stream()
    ups, downs = torch.cuda.Stream(), torch.cuda.Stream()
    done = [torch.cuda.Event() for _ in range(2)]
    copied = [torch.cuda.Event() for _ in range(2)]
    scratch = [torch.empty_like(entry.packed) for _ in range(2)]   # double-buffered inputs
    turn = [0]

    def up(dst=None):
        (entry.packed if dst is None else dst)[batch:].copy_(g.up[0][batch:], non_blocking=True)

    def down():
        g.down[0].copy_(g.res[0], non_blocking=True)

    def plain():
        entry.graph.replay()

    def graph():
        g.graphs[0].replay()

    def with_up():
        up()
        g.graphs[0].replay()

    def with_down():
        g.graphs[0].replay()
        down()

    def with_both():
        up()
        g.graphs[0].replay()
        down()

    def side_copies():
        # turn k's inputs go up on one stream once the graph that last read them (two steps
        # back) is done; the picks go down on another once this graph is: neither copy sits
        # between two graphs on the main stream
        k = turn[0]
        turn[0] ^= 1
        with torch.cuda.stream(ups):
            ups.wait_event(done[k])
            up(scratch[k])
            copied[k].record(ups)
        main.wait_event(copied[k])
        g.graphs[0].replay()
        done[k].record(main)
        with torch.cuda.stream(downs):
            downs.wait_event(done[k])
            down()

    for e in done:
        e.record(main)
    out = {"model": name, "batch": batch, "run_tok_s": round(tps, 1), "run_ms": round(ms, 4)}
    for label, fn in [("plain", plain), ("graph", graph), ("+up", with_up), ("+down", with_down),
                      ("+up+down", with_both), ("side", side_copies), ("plain2", plain)]:
        out[label] = round(timed(fn, reps=steps, warm=4), 4)
    torch.cuda.synchronize()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1b,270m")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--batches", default="16,1")
    args = ap.parse_args()
    import muser
    from cuda_bench import SHAPES
    from cuda_measure import build
    for name in args.models.split(","):
        model, path = build(SHAPES[name], 8192)
        del model
        torch.cuda.empty_cache()
        eng = muser.load(path, device="cuda", dtype="bfloat16", progress=False, max_context=8192)
        for b in (int(x) for x in args.batches.split(",")):
            print(json.dumps(measure(eng, name, SHAPES[name]["vocab"], args.steps, b)), flush=True)


if __name__ == "__main__":
    main()
